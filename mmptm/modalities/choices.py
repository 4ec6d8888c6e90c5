"""The choices of a multiple-choice sample (VCR) and the right one's index, from its ``json``.

A sample's ``json`` holds ``choices``, a list of ``count`` strings (VCR's four answers, or
its four rationales), and ``label``, the index of the right one; its question is the text
plug-in's (``json.question``). This plug-in (``choices``) tokenizes each choice alone as
``[CLS] choice [SEP]`` (at most ``max_len`` tokens, the tail cut) and gives
``choice_ids [B,C,L]`` (padded with the tokenizer's pad id), ``choice_mask [B,C,L]`` (True =
real) and ``choice_labels [B]``. The ``multiple_choice`` head's data side then makes ``C``
rows of each sample, the question joined to each choice
(:class:`mmptm.objectives.vcr.ChoiceRows`).

VCR's two tasks are two samples of one question, keyed ``<question id>-qa`` (Q→A: the
answers) and ``<question id>-qar`` (QA→R: the rationales, the question followed by its right
answer), with ``json.task`` "qa" / "qar": what the converters write and ``mmptm eval vcr``
pairs up to score Q→AR (both right).

Legend: B samples, C choices, L tokens.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from mmptm.modalities.base import Modality, Sample
from mmptm.registry import MODALITIES

#: VCR's tasks: the answers to a question (Q→A), the rationales of its right answer (QA→R)
TASKS = ("qa", "qar")


def task_key(question_id: str, task: str) -> str:
    """The sample key of one of a question's tasks."""
    return f"{question_id}-{task}"


def split_task_key(key: str) -> tuple[str, str]:
    """(question id, task) of a sample key; the task is "" for a key of neither task."""
    question, _, task = key.rpartition("-")
    return (question, task) if question and task in TASKS else (key, "")


@MODALITIES.register("choices")
class ChoiceData(Modality):
    """A sample's tokenized choices and the index of the right one."""

    members: ClassVar[tuple[str, ...]] = ("json",)
    keys: ClassVar[tuple[str, ...]] = ("choice_ids", "choice_mask", "choice_labels")

    @dataclass
    class Config:
        type: str = "choices"
        #: choices per sample (VCR: 4); the ``multiple_choice`` head fixes it
        count: int = 4
        #: tokens per choice, [CLS] and [SEP] included (longer choices lose their tail)
        max_len: int = 32

    def __init__(self, cfg: Config, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        if self.context.tokenizer is None:
            raise ValueError("the choices modality needs a tokenizer (data.tokenizer)")
        if cfg.count < 2:
            raise ValueError(f"data.modalities.choices.count must be >= 2, got {cfg.count}")
        if cfg.max_len < 3:
            raise ValueError(f"data.modalities.choices.max_len must be >= 3, got {cfg.max_len}")
        self.tokenizer = self.context.tokenizer

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        choices, label = meta.get("choices"), meta.get("label")
        n = self.cfg.count
        if not isinstance(choices, list) or len(choices) != n:
            raise ValueError(f"json 'choices' must be a list of {n} strings, got {choices!r}")
        if not all(isinstance(c, str) and c.strip() for c in choices):
            raise ValueError("json 'choices': every choice must be a non-empty string")
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < n:
            raise ValueError(f"json 'label' must be a choice index 0..{n - 1}, got {label!r}")
        tok = self.tokenizer
        ids = [tok.build_inputs(tok.encode(c), None, self.cfg.max_len)[0] for c in choices]
        return {"choice_ids": ids, "choice_labels": label}

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        B, C = len(samples), self.cfg.count
        L = max(len(ids) for s in samples for ids in s["choice_ids"])
        ids_BCL = torch.full((B, C, L), self.tokenizer.pad_id, dtype=torch.long)
        mask_BCL = torch.zeros(B, C, L, dtype=torch.bool)
        for b, s in enumerate(samples):
            for c, ids in enumerate(s["choice_ids"]):
                ids_BCL[b, c, : len(ids)] = torch.tensor(ids)
                mask_BCL[b, c, : len(ids)] = True
        return {
            "choice_ids": ids_BCL,
            "choice_mask": mask_BCL,
            "choice_labels": torch.tensor([s["choice_labels"] for s in samples]),
        }


__all__ = ["TASKS", "ChoiceData", "split_task_key", "task_key"]
