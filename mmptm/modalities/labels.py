"""Targets that ride along in a sample's ``json``: class labels and VQA answers.

Plug-ins like the modalities (no encoder reads them): the objective that trains on them
declares them, so a model without that objective does not decode them.

- ``label``: ``json["label"]`` (a name from ``names`` or its index) → ``labels [B]``.
- ``answers``: VQA's ``json["answers"]`` (raw strings, [] for unannotated questions),
  ``question_id`` and ``answer_type`` → ``answers`` (lists of strings), ``question_id [B]``
  (-1 when absent), ``answer_type`` (strings, "" when absent).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from mmptm.modalities.base import Modality, Sample
from mmptm.registry import MODALITIES

NLI_LABELS = ("entailment", "neutral", "contradiction")


@MODALITIES.register("label")
class LabelData(Modality):
    """One class label per sample (NLI: entailment / neutral / contradiction)."""

    members: ClassVar[tuple[str, ...]] = ("json",)
    keys: ClassVar[tuple[str, ...]] = ("labels",)

    @dataclass
    class Config:
        type: str = "label"
        #: class names in index order
        names: list[str] = field(default_factory=lambda: list(NLI_LABELS))

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        label = meta.get("label")
        names = self.cfg.names
        if isinstance(label, str) and label in names:
            index = names.index(label)
        elif isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(names):
            index = label
        else:
            raise ValueError(f"label {label!r} is not one of {names} (or their index)")
        return {self.prefix(self.views[0]) + "labels": index}

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        key = self.prefix(self.views[0]) + "labels"
        return {key: torch.tensor([s[key] for s in samples])}


@MODALITIES.register("answers")
class AnswerData(Modality):
    """VQA v2 annotations of a question: its raw answers, id and answer type."""

    members: ClassVar[tuple[str, ...]] = ("json",)
    keys: ClassVar[tuple[str, ...]] = ("answers", "question_id", "answer_type")

    @dataclass
    class Config:
        type: str = "answers"

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        answers = meta.get("answers") or []
        if not isinstance(answers, list):
            raise ValueError(f"answers must be a list, got {type(answers).__name__}")
        p = self.prefix(self.views[0])
        return {
            p + "answers": [str(a) for a in answers],
            p + "question_id": int(meta.get("question_id", -1)),
            p + "answer_type": str(meta.get("answer_type", "")),
        }

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        p = self.prefix(self.views[0])
        return {
            p + "answers": [s[p + "answers"] for s in samples],
            p + "question_id": torch.tensor([s[p + "question_id"] for s in samples]),
            p + "answer_type": [s[p + "answer_type"] for s in samples],
        }
