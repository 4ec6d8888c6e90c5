"""Evaluation of the pair-of-images head (``image_pair``, NLVR2): accuracy over a split.

NLVR2's papers also report consistency (the share of its sentences whose every image pair is
judged right); it needs the sentence groups of the real data (the identifiers' prefix) and is
not computed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mmptm.eval.heads import load_head, split_batches
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
    model, head, tokenizer, cfg = load_head(path, ImagePairHead, "image_pair", "nlvr2", overrides)
    rows = PairRows()
    right, n = 0, 0
    for batch in split_batches(
        model, tokenizer, cfg, split=split, shards=shards, device=device,
        prepare=lambda b: rows(b, torch.Generator()),
    ):  # fmt: skip
        pred_B = head.logits(model.fuse(batch)).argmax(-1)
        right += int((pred_B == batch["pair_labels"]).sum())
        n += int(pred_B.numel())
    return {"accuracy": 100.0 * right / max(n, 1), "n": float(n)}


__all__ = ["evaluate_nlvr2"]
