"""Targets that ride along in a sample's ``json``: class labels and VQA answers.

Plug-ins like the modalities (no encoder reads them): the objective that trains on them
declares them, so a model without that objective does not decode them.

- ``label``: ``json["label"]`` (a name from ``names`` or its index) → ``labels [B]``.
- ``label_set``: ``json["labels"]`` (names, or one name) over a vocabulary file (one name per
  line, as ``mmptm data typing`` / ``relations`` write) → ``label_set [B,C]`` (multi-hot,
  float) and ``label_unknown [B]`` (how many of the sample's names the vocabulary lacks: they
  are dropped and counted, so evaluation can count them as missed).
- ``answers``: VQA's ``json["answers"]`` (raw strings, [] for unannotated questions),
  ``question_id`` and ``answer_type`` → ``answers`` (lists of strings), ``question_id [B]``
  (-1 when absent), ``answer_type`` (strings, "" when absent).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
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


def read_labels(path: str | Path) -> list[str]:
    """A label vocabulary: one label per line, row i = line i."""
    try:
        labels = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file (a label vocabulary)") from None
    if not labels or len(set(labels)) != len(labels) or "" in labels:
        raise ValueError(f"{path}: a label vocabulary needs one distinct, non-empty label per line")
    return labels


@MODALITIES.register("label_set")
class LabelSetData(Modality):
    """A set of label names per sample over a vocabulary file (entity types, a relation)."""

    members: ClassVar[tuple[str, ...]] = ("json",)
    keys: ClassVar[tuple[str, ...]] = ("label_set", "label_unknown")

    @dataclass
    class Config:
        type: str = "label_set"
        #: the vocabulary: one name per line (a task head declares it)
        names_file: str = ""
        #: the json field holding the sample's names (a list, or one string)
        field: str = "labels"

    def __init__(self, cfg: Config, **kw: Any) -> None:
        super().__init__(cfg, **kw)
        if not cfg.names_file:
            raise ValueError("data.modalities.label_set.names_file is empty (a label vocabulary)")
        self.index = {name: i for i, name in enumerate(read_labels(cfg.names_file))}

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        names = meta.get(self.cfg.field)
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"json {self.cfg.field!r} must be a list of label names: {names!r}")
        p = self.prefix(self.views[0])
        known = sorted({self.index[n] for n in names if n in self.index})
        return {p + "label_set": known, p + "label_unknown": len(set(names)) - len(known)}

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        p = self.prefix(self.views[0])
        hot_BC = torch.zeros(len(samples), len(self.index))
        for i, s in enumerate(samples):
            hot_BC[i, s[p + "label_set"]] = 1.0
        unknown_B = torch.tensor([s[p + "label_unknown"] for s in samples])
        return {p + "label_set": hot_BC, p + "label_unknown": unknown_B}


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
