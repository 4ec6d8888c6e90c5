"""Masked unit prediction: VideoBERT's masked visual words (HuBERT's masked units reuse it).

Data side (:class:`MaskUnits`): selects ``mask_prob`` of each sample's real steps
(``<prefix>unit_mask``) with :func:`~mmptm.objectives.masking.select_positions`; a selected
step is marked in ``<prefix>unit_masked [B,T]`` with probability ``replace_with_mask`` (the
units encoder then puts its learned [MASK] embedding there) and otherwise kept as it is.
``<prefix>unit_labels [B,T]`` holds the original id at every selected step, -100 elsewhere.
BERT's third option, a random token, is left out: the unit vocabulary is the encoder's
codebook, which the data side does not see, and VideoBERT/HuBERT do without it.

When ITM negatives are in the batch (``itm_labels == 0``) their units are masked like the rest
(so masking gives ITM no hint) but carry no labels, as MLM does for their text.

Loss side: a BERT transform head on the fused hidden states of the units view at the
labelled steps only; the output layer is tied to the units encoder's embedding table (K
rows), as VideoBERT adds its visual words to BERT's vocabulary. Cross-entropy over K; metric
``acc``.

Legend: B batch, T steps, D width, M labelled steps, K units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import VocabInfo, init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import view_prefix
from mmptm.objectives.base import Objective
from mmptm.objectives.masking import select_positions
from mmptm.registry import OBJECTIVES

IGNORE = -100


@dataclass(frozen=True)
class MaskUnits:
    """Masked-unit data side over one units view; writes ``unit_masked`` and ``unit_labels``."""

    data_priority: ClassVar[int] = 20

    prefix: str
    mask_prob: float
    p_mask: float

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        p = self.prefix
        if f"{p}unit_ids" not in batch:  # another source of a mixture: nothing to mask
            return batch
        ids_BT = batch[f"{p}unit_ids"]
        real_BT = batch.get(f"{p}unit_mask")
        real_BT = torch.ones_like(ids_BT, dtype=torch.bool) if real_BT is None else real_BT.bool()
        selected_BT = select_positions(real_BT, self.mask_prob, g)
        masked_BT = selected_BT & (torch.rand(ids_BT.shape, generator=g) < self.p_mask)
        labels_BT = torch.where(selected_BT, ids_BT, torch.full_like(ids_BT, IGNORE))
        if "itm_labels" in batch:
            labels_BT[batch["itm_labels"] == 0] = IGNORE
        batch[f"{p}unit_masked"] = masked_BT
        batch[f"{p}unit_labels"] = labels_BT
        return batch


@OBJECTIVES.register("masked_units")
class MaskedUnits(Objective):
    """Predict the codebook id of masked steps of a units view (tied output layer)."""

    @dataclass
    class Config:
        type: str = "masked_units"
        weight: float = 1.0
        #: the units encoder (view, and hidden-state stream) this objective reads
        modality: str = "units"
        mask_prob: float = 0.15
        #: share of selected steps given the [MASK] embedding; the rest are kept
        replace_with_mask: float = 0.8
        layer_norm_eps: float = 1e-12

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> MaskUnits:
        if not 0.0 < cfg.mask_prob < 1.0:
            raise ValueError(f"masked_units.mask_prob must be in (0, 1), got {cfg.mask_prob}")
        if not 0.0 <= cfg.replace_with_mask <= 1.0:
            raise ValueError(
                f"masked_units.replace_with_mask must be in [0, 1], got {cfg.replace_with_mask}"
            )
        return MaskUnits(
            prefix=view_prefix("units", cfg.modality),
            mask_prob=cfg.mask_prob,
            p_mask=cfg.replace_with_mask,
        )

    def __init__(self, cfg: Config, *, width: int, encoders: nn.ModuleDict, **_: object) -> None:
        super().__init__()
        self.cfg = cfg
        enc = encoders[cfg.modality] if cfg.modality in encoders else None  # noqa: SIM401
        if enc is None or not isinstance(getattr(enc, "unit", None), nn.Embedding):
            raise ValueError(
                f"masked_units.modality={cfg.modality!r} is not a units encoder of this model"
            )
        # A list keeps the shared table out of this module's state dict (it is tied).
        self._unit = [enc.unit]
        self.transform = nn.Sequential(
            nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        )
        self.bias = nn.Parameter(torch.zeros(enc.unit.num_embeddings))
        self.prefix = view_prefix("units", cfg.modality)
        init_weights(self.transform)

    def logits(self, h_MD: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(h_MD), self._unit[0].weight, self.bias)  # [M,K]

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        key = f"{self.prefix}unit_labels"
        if key not in batch or self.cfg.modality not in out.hidden:
            return {}  # a batch without this view (another source of a mixture)
        labels_BT = batch[key]
        h_BTD = out.hidden[self.cfg.modality]
        if h_BTD.shape[:2] != labels_BT.shape:
            raise ValueError(
                f"masked_units: hidden[{self.cfg.modality!r}] is {tuple(h_BTD.shape)} but "
                f"{key} is {tuple(labels_BT.shape)}"
            )
        sel_BT = labels_BT != IGNORE
        logits_MK = self.logits(h_BTD[sel_BT]).float()
        target_M = labels_BT[sel_BT]
        n = target_M.numel()  # sum / count: nothing masked gives 0, not NaN
        loss = F.cross_entropy(logits_MK, target_M, reduction="sum") / max(n, 1)
        acc = (logits_MK.argmax(-1) == target_M).float().sum() / max(n, 1)
        return {"loss": loss, "acc": acc.detach()}
