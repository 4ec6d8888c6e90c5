"""Referring expressions (RefCOCO, RefCOCO+, RefCOCOg): pick the region an expression names.

Head (UNITER's, Chen et al. 2020): an MLP scores every fused region state
(``hidden[regions] [B,R,D]``, the expression in the text stream beside it); padding regions
get -inf; cross-entropy over the regions of a sample. The target is the region whose box has
the highest IoU with the gold box ``ref_box [B,4]`` (the ``ref_box`` plug-in), when that IoU
is at least ``target_iou`` (detector boxes need not hold the gold one exactly); a sample with
no such region gives no loss but still counts in the accuracy.

Metric (the papers'): ``acc`` = the fraction of expressions whose picked region's box has
IoU >= 0.5 with the gold box. Boxes are [x1, y1, x2, y2] normalised to [0, 1], the frame of
``region_boxes``; IoU is a ratio, so the normalisation leaves it unchanged.

Legend: B batch, R regions, D width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mmptm.batch import Batch
from mmptm.encoders.base import init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need
from mmptm.objectives.base import Objective
from mmptm.objectives.heads import mlp_head
from mmptm.registry import OBJECTIVES

#: IoU at which a picked region counts as right (RefCOCO's evaluation)
HIT_IOU = 0.5


def box_iou(a_N4: torch.Tensor, b_N4: torch.Tensor) -> torch.Tensor:
    """IoU [N] of paired [x1, y1, x2, y2] boxes (0 where both are empty)."""
    lt_N2 = torch.maximum(a_N4[..., :2], b_N4[..., :2])
    rb_N2 = torch.minimum(a_N4[..., 2:], b_N4[..., 2:])
    inter_N = (rb_N2 - lt_N2).clamp_min(0).prod(-1)
    area_a = (a_N4[..., 2:] - a_N4[..., :2]).clamp_min(0).prod(-1)
    area_b = (b_N4[..., 2:] - b_N4[..., :2]).clamp_min(0).prod(-1)
    union_N = area_a + area_b - inter_N
    return torch.where(union_N > 0, inter_N / union_N.clamp_min(1e-12), torch.zeros_like(union_N))


def region_targets(
    boxes_BR4: torch.Tensor, mask_BR: torch.Tensor, gold_B4: torch.Tensor, min_iou: float
) -> torch.Tensor:
    """Per sample, the real region of highest IoU with the gold box if >= ``min_iou``, else -1."""
    iou_BR = box_iou(boxes_BR4, gold_B4[:, None, :].expand_as(boxes_BR4))
    iou_BR = iou_BR.masked_fill(~mask_BR, -1.0)
    best_B, index_B = iou_BR.max(-1)
    return torch.where(best_B >= min_iou, index_B, torch.full_like(index_B, -1))


@OBJECTIVES.register("region_selection")
class RegionSelection(Objective):
    """A score per region; cross-entropy over the regions (module docstring)."""

    @dataclass
    class Config:
        type: str = "region_selection"
        weight: float = 1.0
        #: the region encoder (and hidden-state stream) scored
        modality: str = "regions"
        #: IoU with the gold box a region needs to be the training target
        target_iou: float = 0.5
        #: hidden size of the MLP as a multiple of the width
        hidden_mult: int = 1
        layer_norm_eps: float = 1e-12

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        if not 0.0 < cfg.target_iou <= 1.0:
            raise ValueError(f"region_selection.target_iou must be in (0, 1], got {cfg.target_iou}")
        if cfg.hidden_mult < 1:
            raise ValueError(f"region_selection.hidden_mult must be >= 1, got {cfg.hidden_mult}")
        self.cfg = cfg
        hidden = cfg.hidden_mult * width
        self.head = mlp_head(width, hidden, 1, cfg.layer_norm_eps)
        init_weights(self)

    def data_needs(self) -> dict[str, Need]:
        return {"ref_box": Need("ref_box")}

    def logits(self, out: FusionOutput, batch: Batch) -> torch.Tensor:
        """Region scores [B,R], -inf at padding."""
        m = self.cfg.modality
        if m not in out.hidden:
            raise ValueError(
                f"region_selection.modality={m!r} has no hidden states (fusion gave "
                f"{sorted(out.hidden)})"
            )
        h_BRD, mask_BR = out.hidden[m], out.mask[m]
        boxes_BR4 = batch["region_boxes"]
        if h_BRD.shape[:2] != boxes_BR4.shape[:2]:
            raise ValueError(
                f"region_selection: hidden[{m!r}] is {tuple(h_BRD.shape)} but region_boxes "
                f"is {tuple(boxes_BR4.shape)} (a fusion that adds tokens to the regions)"
            )
        scores_BR = self.head(h_BRD).squeeze(-1).float()
        return scores_BR.masked_fill(~mask_BR.bool(), float("-inf"))

    @torch.no_grad()
    def predict(self, out: FusionOutput, batch: Batch) -> torch.Tensor:
        """Index [B] of the picked region."""
        return self.logits(out, batch).argmax(-1)

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        if "ref_box" not in batch:
            return {}
        logits_BR = self.logits(out, batch)
        boxes_BR4, gold_B4 = batch["region_boxes"].float(), batch["ref_box"].float()
        mask_BR = torch.isfinite(logits_BR)
        target_B = region_targets(boxes_BR4, mask_BR, gold_B4, self.cfg.target_iou)
        has_B = target_B >= 0
        n = max(int(has_B.sum()), 1)
        safe_BR = logits_BR.masked_fill(~mask_BR, -1e4)  # -inf * 0 would be NaN in the grad
        loss = F.cross_entropy(safe_BR, target_B, ignore_index=-1, reduction="sum") / n
        pick_B = logits_BR.argmax(-1)
        picked_B4 = boxes_BR4.gather(1, pick_B[:, None, None].expand(-1, 1, 4)).squeeze(1)
        acc = (box_iou(picked_B4, gold_B4) >= HIT_IOU).float().mean()
        return {"loss": loss, "acc": acc.detach()}


__all__ = ["HIT_IOU", "RegionSelection", "box_iou", "region_targets"]
