"""Evaluation of the pair-of-images head (``image_pair``, NLVR2): accuracy over a split.

NLVR2's papers also report consistency (the share of its sentences whose every image pair is
judged right); it needs the sentence groups of the real data (the identifiers' prefix) and is
not computed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mmptm.batch import move_to
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.models.load import load_pretrained
from mmptm.objectives.nlvr2 import ImagePairHead, PairRows


@torch.no_grad()
def evaluate_nlvr2(
    path: str,
    *,
    split: str = "test",
    shards: str | None = None,
    overrides: Sequence[str] = (),
    device: str = "cpu",
) -> dict[str, Any]:
    """Accuracy (%) of a fine-tuned checkpoint's true/false judgements: ``accuracy``, ``n``."""
    model, tokenizer, cfg = load_pretrained(path, overrides)
    head = next((o for o in model.objectives.values() if isinstance(o, ImagePairHead)), None)
    if head is None:
        raise ValueError(
            "the model has no image_pair objective (fine-tune one: mmptm finetune nlvr2 init=RUN)"
        )
    model.to(device)
    model.eval()
    stream = stream_config(
        cfg.data, tokenizer, split=split, shards=shards, needs=model.data_needs(), seed=cfg.seed
    )
    rows = PairRows()
    right, n = 0, 0
    for batch in single_pass(stream):
        if "__end__" in batch:
            continue
        batch = move_to(rows(batch, torch.Generator()), device)
        pred_B = head.logits(model.fuse(batch)).argmax(-1)
        right += int((pred_B == batch["pair_labels"]).sum())
        n += int(pred_B.numel())
    return {"accuracy": 100.0 * right / max(n, 1), "n": float(n)}


__all__ = ["evaluate_nlvr2"]
