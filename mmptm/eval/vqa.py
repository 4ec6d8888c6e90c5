"""VQA evaluation: accuracy (official soft score) and predictions in the official format."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mmptm.eval.heads import load_head, split_batches
from mmptm.objectives.vqa import VQAHead, soft_score


def vqa_accuracy(predictions: Mapping[int, str], answers: Mapping[int, Sequence[str]]) -> float:
    """Mean official accuracy ×100 (a percentage, as the official script prints) over the
    predicted questions."""
    if not predictions:
        raise ValueError("vqa_accuracy: no predictions")
    unknown = [q for q in predictions if q not in answers]
    if unknown:
        raise KeyError(f"vqa_accuracy: {len(unknown)} predicted questions have no answers, "
                       f"e.g. {unknown[:3]}")  # fmt: skip
    total = sum(soft_score(answers[q], a) for q, a in predictions.items())
    return 100.0 * total / len(predictions)


def write_results(predictions: Mapping[int, str], path: str | Path) -> None:
    """The official results file: ``[{"question_id": int, "answer": str}, ...]``."""
    rows = [{"question_id": int(q), "answer": a} for q, a in sorted(predictions.items())]
    Path(path).write_text(json.dumps(rows), encoding="utf-8")


def read_results(path: str | Path) -> dict[int, str]:
    """Question id → answer of an official results file."""
    return {int(r["question_id"]): r["answer"] for r in json.loads(Path(path).read_text())}


@torch.no_grad()
def evaluate_vqa(
    path: str,
    *,
    split: str = "test",
    shards: str | None = None,
    results_file: str | Path | None = None,
    overrides: Sequence[str] = (),
    device: str = "cpu",
) -> dict[str, Any]:
    """VQA accuracy (%) of a fine-tuned checkpoint; writes ``[{question_id, answer}]`` if asked.

    Questions without answers (a test-dev style split) are predicted but not scored. Keys:
    ``accuracy``, ``scored``, ``predicted`` and ``per_answer_type`` (yes/no, number, other).
    """
    model, head, tokenizer, cfg = load_head(path, VQAHead, "vqa", "vqa", overrides)
    predictions: dict[int, str] = {}
    scores: list[float] = []
    by_type: dict[str, list[float]] = defaultdict(list)
    for batch in split_batches(model, tokenizer, cfg, split=split, shards=shards, device=device):
        answers = batch.get("answers")
        pred_B = head.predict(model.fuse(batch)).cpu()
        for b, answer in enumerate(head.answer_strings(pred_B)):
            predictions[int(batch["question_id"][b])] = answer
            if answers and answers[b]:
                scores.append(soft_score(answers[b], answer))
                kind = batch.get("answer_type", [""] * len(answers))[b]
                if kind:  # a question without answer_type counts only in the overall accuracy
                    by_type[kind].append(scores[-1])
    if results_file is not None:
        write_results(predictions, results_file)
    return {
        "accuracy": 100.0 * sum(scores) / max(len(scores), 1),
        "scored": float(len(scores)),
        "predicted": float(len(predictions)),
        # the official evaluator's perAnswerType, where the questions carry answer_type
        "per_answer_type": {t: 100.0 * sum(v) / len(v) for t, v in sorted(by_type.items())},
    }
