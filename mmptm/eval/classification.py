"""Accuracy of a classification head on named evaluation sets (XNLI: one set per language)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmptm.batch import move_to
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.classification import Classification
from mmptm.recipe import RunConfig


@torch.no_grad()
def accuracy(model: PretrainModel, cfg: RunConfig, tokenizer, shards: str, device: str) -> float:
    """Fraction of samples in ``shards`` whose argmax class equals ``labels``."""
    heads = [o for o in model.objectives.values() if isinstance(o, Classification)]
    if not heads:
        raise ValueError("the model has no classification objective (a fine-tuned task head)")
    stream = stream_config(
        cfg.data, tokenizer, split="test", shards=shards, needs=model.data_needs(), seed=cfg.seed
    )
    right = total = 0
    for batch in single_pass(stream):
        if "__end__" in batch:
            continue
        batch = move_to(batch, device)
        pred_B = heads[0].logits(model.fuse(batch)).argmax(-1)
        right += int((pred_B == batch["labels"]).sum())
        total += len(pred_B)
    if total == 0:
        raise ValueError(f"no samples in {shards}")
    return right / total


def evaluate_sets(
    model: PretrainModel, cfg: RunConfig, tokenizer, sets: dict[str, str], device: str = "cpu"
) -> dict[str, float]:
    """Accuracy per named set, plus their mean (``avg``)."""
    if not sets:
        raise ValueError("no evaluation sets: set data.eval (name: shards) or pass --set")
    model.eval().to(device)
    result = {name: accuracy(model, cfg, tokenizer, spec, device) for name, spec in sets.items()}
    result["avg"] = sum(result.values()) / len(result)
    return result


def evaluate_classification(
    path: str,
    sets: dict[str, str] | None = None,
    overrides: Sequence[str] = (),
    device: str = "cpu",
) -> dict[str, float]:
    """Accuracy of a fine-tuned checkpoint on ``sets`` (default: its config's data.eval)."""
    model, tokenizer, cfg = load_pretrained(path, overrides)
    return evaluate_sets(model, cfg, tokenizer, sets or cfg.data.eval, device)


def format_accuracy(rows: dict[str, dict[str, float]]) -> str:
    """A table: one row per run, one column per evaluation set."""
    cols = list(next(iter(rows.values())))
    w = max(18, *(len(name) + 2 for name in rows))
    lines = [f"{'':<{w}}" + "".join(f"{c:>8}" for c in cols)]
    for name, r in rows.items():
        lines.append(f"{name:<{w}}" + "".join(f"{100 * r[c]:>7.1f}%" for c in cols))
    return "\n".join(lines)
