"""Evaluation of referring expressions (``region_selection``): accuracy at IoU >= 0.5.

An expression counts as right when the region the head picks has a box of IoU >= 0.5 with the
gold box (RefCOCO's evaluation, as UNITER and MAttNet report it); the accuracy is over every
expression of the split, those whose gold box no detected region covers included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mmptm.eval.heads import load_head, split_batches
from mmptm.objectives.refexp import HIT_IOU, RegionSelection, box_iou


@torch.no_grad()
def evaluate_refexp(
    path: str,
    *,
    split: str = "test",
    shards: str | None = None,
    overrides: Sequence[str] = (),
    device: str = "cpu",
) -> dict[str, Any]:
    """Accuracy (%) of a fine-tuned checkpoint's region selection: ``accuracy``, ``n``."""
    model, head, tokenizer, cfg = load_head(
        path, RegionSelection, "region_selection", "refcoco", overrides
    )
    hits, n = 0, 0
    for batch in split_batches(model, tokenizer, cfg, split=split, shards=shards, device=device):
        pick_B = head.predict(model.fuse(batch), batch)
        boxes_BR4 = batch["region_boxes"].float()
        picked_B4 = boxes_BR4.gather(1, pick_B[:, None, None].expand(-1, 1, 4)).squeeze(1)
        hits += int((box_iou(picked_B4, batch["ref_box"].float()) >= HIT_IOU).sum())
        n += int(pick_B.numel())
    return {"accuracy": 100.0 * hits / max(n, 1), "n": float(n)}


__all__ = ["evaluate_refexp"]
