"""Evaluation of the multiple-choice head (``multiple_choice``, VCR): Q→A, QA→R and Q→AR.

A split holds each question twice (:mod:`mmptm.modalities.choices`): its answers (key
``<id>-qa``) and its rationales (``<id>-qar``). Q→A and QA→R are the accuracies of the two
kinds of samples; Q→AR, what VCR's leaderboard ranks by, counts a question right when both its
answer and its rationale are picked right, over the questions that have both samples.
``accuracy`` is over every sample, whatever its key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mmptm.batch import KEY
from mmptm.eval.heads import load_head, split_batches
from mmptm.modalities.choices import split_task_key
from mmptm.objectives.vcr import ChoiceRows, MultipleChoiceHead


def vcr_scores(right: dict[str, bool]) -> dict[str, float]:
    """Q→A, QA→R, Q→AR and overall accuracy (%) with their counts, from sample key →
    whether its pick was right (module docstring)."""
    tasks: dict[str, dict[str, bool]] = {"qa": {}, "qar": {}}
    for key, ok in right.items():
        question, task = split_task_key(key)
        if task:
            tasks[task][question] = ok
    both = tasks["qa"].keys() & tasks["qar"].keys()
    joint = [tasks["qa"][q] and tasks["qar"][q] for q in both]

    def pct(hits: Any) -> float:
        hits = list(hits)
        return 100.0 * sum(hits) / max(len(hits), 1)

    return {
        "q_a": pct(tasks["qa"].values()), "n_q_a": float(len(tasks["qa"])),
        "qa_r": pct(tasks["qar"].values()), "n_qa_r": float(len(tasks["qar"])),
        "q_ar": pct(joint), "n_q_ar": float(len(joint)),
        "accuracy": pct(right.values()), "n": float(len(right)),
    }  # fmt: skip


@torch.no_grad()
def evaluate_vcr(
    path: str,
    *,
    split: str = "test",
    shards: str | None = None,
    overrides: Sequence[str] = (),
    device: str = "cpu",
) -> dict[str, Any]:
    """Accuracies (%) of a fine-tuned checkpoint's picks: ``q_a``, ``qa_r``, ``q_ar``,
    ``accuracy`` and their counts ``n_*`` (module docstring)."""
    model, head, tokenizer, cfg = load_head(
        path, MultipleChoiceHead, "multiple_choice", "vcr", overrides
    )
    C = head.cfg.choices
    right: dict[str, bool] = {}
    for batch in split_batches(
        model, tokenizer, cfg, split=split, shards=shards, device=device,
        transforms=[ChoiceRows()],
    ):  # fmt: skip
        ok_B = head.logits(model.fuse(batch)).argmax(-1) == batch["choice_labels"]
        right.update(zip(batch[KEY][::C], ok_B.tolist()))  # the keys repeat for each row
    return vcr_scores(right)


__all__ = ["evaluate_vcr", "vcr_scores"]
