"""NLVR2 (Suhr et al. 2019): is a statement true of a pair of images? The pair-of-images head.

Data side (:class:`PairRows`): each sample (the statement, the left image's regions, the
right image's from the ``image_pair`` plug-in) becomes two consecutive rows, the statement
with the left image and the statement with the right one: text keys repeated, region keys
interleaved (padded to the larger region count), ``pair_labels [B]`` left as it is. The model
then fuses 2B rows as it fuses any batch (UNITER's and LXMERT's "pair" setup).

Head: the two rows' pooled vectors joined, [B, 2D], then an MLP → 2 logits (false, true);
cross-entropy against ``pair_labels``; the metric is accuracy (NLVR2's).

Legend: B pairs, R regions, D width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from mmptm.batch import Batch
from mmptm.encoders.base import init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need
from mmptm.objectives.base import Objective
from mmptm.objectives.heads import mlp_head
from mmptm.objectives.rows import repeat_rows
from mmptm.registry import OBJECTIVES

#: region keys of the left image → the right image's
_REGION_KEYS = {
    "region_feats": "right_region_feats",
    "region_boxes": "right_region_boxes",
    "region_mask": "right_region_mask",
}


def _interleave(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """[B,R1,...] and [B,R2,...] → [2B,max(R1,R2),...], rows left0, right0, left1, ..."""
    R = max(left.shape[1], right.shape[1])
    out = left.new_zeros(2 * left.shape[0], R, *left.shape[2:])
    out[0::2, : left.shape[1]] = left
    out[1::2, : right.shape[1]] = right
    return out


@dataclass(frozen=True)
class PairRows:
    """Each pair → two rows, the statement with each image (module docstring)."""

    data_priority: ClassVar[int] = 12  # after negatives (10), before text joining (15)

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        if "pair_labels" not in batch:
            return batch
        B = len(batch["pair_labels"])
        out: Batch = {"pair_labels": batch["pair_labels"]}
        for key, right in _REGION_KEYS.items():
            out[key] = _interleave(batch[key], batch[right])
        for key, value in batch.items():
            if key in out or key in _REGION_KEYS.values():
                continue
            if key.startswith("region_"):  # detector outputs the right image lacks
                continue
            out[key] = repeat_rows(value, B, 2)
        return out


@OBJECTIVES.register("image_pair")
class ImagePairHead(Objective):
    """True / false of a statement about two images from their two pooled vectors joined."""

    @dataclass
    class Config:
        type: str = "image_pair"
        weight: float = 1.0
        #: which pooled vector of each row
        pooled: str = "joint"
        #: hidden size of the MLP as a multiple of the joined width (2D)
        hidden_mult: int = 1
        layer_norm_eps: float = 1e-12

    @classmethod
    def data_transform(cls, cfg: Config, vocab: object, **_: Any) -> PairRows:
        return PairRows()

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        if cfg.hidden_mult < 1:
            raise ValueError(f"image_pair.hidden_mult must be >= 1, got {cfg.hidden_mult}")
        self.cfg = cfg
        hidden = cfg.hidden_mult * 2 * width
        self.head = mlp_head(2 * width, hidden, 2, cfg.layer_norm_eps)
        init_weights(self)

    def data_needs(self) -> dict[str, Need]:
        return {"image_pair": Need("image_pair")}

    def logits(self, out: FusionOutput) -> torch.Tensor:
        """[B,2] logits (false, true) of the pairs of rows."""
        if self.cfg.pooled not in out.pooled:
            raise ValueError(
                f"image_pair.pooled={self.cfg.pooled!r} is not produced by this fusion "
                f"(has {sorted(out.pooled)})"
            )
        p_2BD = out.pooled[self.cfg.pooled]
        if p_2BD.shape[0] % 2:
            raise ValueError(
                "image_pair: an odd number of rows (the PairRows data side did not run)"
            )
        joined_BD2 = p_2BD.reshape(p_2BD.shape[0] // 2, -1)  # [2B,D] → [B,2D]: left ‖ right
        return self.head(joined_BD2).float()

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        if "pair_labels" not in batch:
            return {}
        logits_B2 = self.logits(out)
        labels_B = batch["pair_labels"].to(logits_B2.device)
        loss = F.cross_entropy(logits_B2, labels_B)
        acc = (logits_B2.argmax(-1) == labels_B).float().mean()
        return {"loss": loss, "acc": acc.detach()}


__all__ = ["ImagePairHead", "PairRows"]
