"""Masked region modelling (UNITER, LXMERT, ViLBERT): one data side, three loss sides.

Data side (:class:`MaskRegions`): picks ``mask_prob`` of each sample's real regions (at least
one per sample that has any), zeroes their features in ``region_feats`` and records
``region_masked [B,R]`` and ``region_target_feats [B,R,F]`` (the unmasked features).
MRC, MRC-kl and MRFR all return an *equal* ``MaskRegions`` whose class is ``shared``, so the
model's ``data_transforms`` runs it once however many of them a recipe lists (configs that
disagree on ``mask_prob`` are an error there).

Loss sides, evaluated only at masked regions (``hidden[modality][region_masked]`` → [M,D]):

- ``mrc``: classify the region, cross-entropy against the argmax of the detector's
  ``region_probs`` (UNITER MRC) or against ``region_labels`` (``target: labels``).
- ``mrc_kl``: KL(p ‖ q) = Σ p log(p / q), p = ``region_probs``, q = the head's softmax
  (UNITER MRC-kl, ViLBERT's masked region loss).
- ``mrfr``: regress the original feature, squared error summed over F and averaged over the
  masked regions (UNITER MRFR, LXMERT's feature regression).

Legend: B batch, R regions, F region feature dim, C detector classes, D width, M masked regions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import VocabInfo, init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.base import Objective
from mmptm.objectives.masking import select_positions
from mmptm.registry import OBJECTIVES


@dataclass(frozen=True)
class MaskRegions:
    """Region masking data side shared by ``mrc``, ``mrc_kl`` and ``mrfr``.

    When ITM negatives are in the batch (``itm_labels == 0``) their regions are zeroed like
    the rest, so masking gives ITM no hint, but none is marked in ``region_masked``: as in
    UNITER, masked region modelling is learnt on positive pairs only. A batch without
    ``region_feats`` (another source of a mixture, or RoI regions) is left as it is.
    """

    data_priority: ClassVar[int] = 20
    #: run once for every objective that asks for it (see ``models.pretrain.data_transforms``)
    shared: ClassVar[bool] = True

    mask_prob: float

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        if "region_feats" not in batch:
            return batch
        feats_BRF = batch["region_feats"]
        B, R = feats_BRF.shape[:2]
        real_BR = batch.get("region_mask")
        real_BR = torch.ones(B, R, dtype=torch.bool) if real_BR is None else real_BR.bool()
        zeroed_BR = select_positions(real_BR, self.mask_prob, g, at_least_one=True)
        masked_BR = zeroed_BR.clone()
        if "itm_labels" in batch:
            masked_BR &= (batch["itm_labels"] != 0).unsqueeze(1)
        batch["region_target_feats"] = feats_BRF
        batch["region_feats"] = feats_BRF.masked_fill(zeroed_BR.unsqueeze(-1), 0.0)
        batch["region_masked"] = masked_BR
        return batch


def _prediction_head(width: int, out_dim: int, eps: float) -> nn.Sequential:
    """Linear-GELU-LN-Linear, UNITER's region classification / feature regression head."""
    return nn.Sequential(
        nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width, eps=eps), nn.Linear(width, out_dim)
    )


class _MaskedRegionObjective(Objective):
    """Shared plumbing: the data side and the hidden states at masked regions."""

    @classmethod
    def data_transform(cls, cfg, vocab: VocabInfo) -> MaskRegions:
        if not 0.0 < cfg.mask_prob < 1.0:
            raise ValueError(f"{cfg.type}.mask_prob must be in (0, 1), got {cfg.mask_prob}")
        return MaskRegions(mask_prob=float(cfg.mask_prob))

    def masked_hidden(self, out: FusionOutput, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states [M,D] at masked regions, the mask [B,R])."""
        modality = self.cfg.modality
        if modality not in out.hidden:
            raise ValueError(
                f"{self.cfg.type}.modality={modality!r} has no hidden states "
                f"(fusion gave {sorted(out.hidden)})"
            )
        masked_BR = batch["region_masked"]
        h_BRD = out.hidden[modality]
        if h_BRD.shape[:2] != masked_BR.shape:
            raise ValueError(
                f"{self.cfg.type}: hidden[{modality!r}] is {tuple(h_BRD.shape)} but "
                f"region_masked is {tuple(masked_BR.shape)}"
            )
        return h_BRD[masked_BR], masked_BR


@OBJECTIVES.register("mrc")
class MaskedRegionClassification(_MaskedRegionObjective):
    """MRC: cross-entropy against the detector's top class (or given region labels)."""

    @dataclass
    class Config:
        type: str = "mrc"
        weight: float = 1.0
        #: the region encoder (and hidden-state stream) this objective reads
        modality: str = "regions"
        mask_prob: float = 0.15
        #: detector classes C (1601 = Visual Genome's 1600 + background, bottom-up attention)
        num_classes: int = 1601
        #: ``probs``: argmax of ``region_probs``; ``labels``: ``region_labels`` (-1 = none)
        target: Literal["probs", "labels"] = "probs"
        layer_norm_eps: float = 1e-12

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        if cfg.num_classes < 2:
            raise ValueError(f"{cfg.type}.num_classes must be >= 2, got {cfg.num_classes}")
        self.cfg = cfg
        self.head = _prediction_head(width, cfg.num_classes, cfg.layer_norm_eps)
        init_weights(self)

    def region_probs(self, batch: Batch, masked_BR: torch.Tensor) -> torch.Tensor:
        """Detector distributions [M,C] at the masked regions."""
        if "region_probs" not in batch:
            raise KeyError(f"{self.cfg.type} needs `region_probs` in the batch (regions.npz probs)")
        probs_BRC = batch["region_probs"]
        if probs_BRC.shape[-1] != self.cfg.num_classes:
            raise ValueError(
                f"region_probs have {probs_BRC.shape[-1]} classes, "
                f"{self.cfg.type}.num_classes={self.cfg.num_classes}"
            )
        return probs_BRC[masked_BR].float()

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        if "region_masked" not in batch:  # inactive on this batch (see MaskRegions)
            return {}
        h_MD, masked_BR = self.masked_hidden(out, batch)
        logits_MC = self.head(h_MD).float()
        if self.cfg.target == "labels":
            if "region_labels" not in batch:
                raise KeyError("mrc with target=labels needs `region_labels` in the batch")
            target_M = batch["region_labels"][masked_BR].long()
            if bool((target_M >= self.cfg.num_classes).any()):
                raise ValueError(f"region_labels exceed num_classes={self.cfg.num_classes}")
        else:
            target_M = self.region_probs(batch, masked_BR).argmax(-1)
        valid_M = target_M >= 0
        # Sum / count: a batch with nothing masked gives 0, not NaN, and keeps the graph.
        n = int(valid_M.sum())
        loss = F.cross_entropy(logits_MC, target_M, ignore_index=-1, reduction="sum") / max(n, 1)
        hit_M = (logits_MC.argmax(-1) == target_M) & valid_M
        return {"loss": loss, "acc": (hit_M.float().sum() / max(n, 1)).detach()}


@OBJECTIVES.register("mrc_kl")
class MaskedRegionClassificationKL(MaskedRegionClassification):
    """MRC-kl: KL divergence from the detector's class distribution to the head's softmax."""

    @dataclass
    class Config:
        type: str = "mrc_kl"
        weight: float = 1.0
        modality: str = "regions"
        mask_prob: float = 0.15
        num_classes: int = 1601
        layer_norm_eps: float = 1e-12

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        if "region_masked" not in batch:
            return {}
        h_MD, masked_BR = self.masked_hidden(out, batch)
        logq_MC = F.log_softmax(self.head(h_MD).float(), dim=-1)
        p_MC = self.region_probs(batch, masked_BR)
        n = p_MC.shape[0]
        # kl_div uses xlogy, so classes with p = 0 contribute 0 rather than NaN.
        loss = F.kl_div(logq_MC, p_MC, reduction="sum") / max(n, 1)
        hit_M = logq_MC.argmax(-1) == p_MC.argmax(-1)
        return {"loss": loss, "acc": (hit_M.float().sum() / max(n, 1)).detach()}


@OBJECTIVES.register("mrfr")
class MaskedRegionFeatureRegression(_MaskedRegionObjective):
    """MRFR: regress the masked regions' input features (L2)."""

    @dataclass
    class Config:
        type: str = "mrfr"
        weight: float = 1.0
        modality: str = "regions"
        mask_prob: float = 0.15
        #: F; 0 = the ``feature_dim`` of the region encoder named by ``modality``
        feature_dim: int = 0
        layer_norm_eps: float = 1e-12

    def __init__(
        self, cfg: Config, *, width: int, encoders: nn.ModuleDict | None = None, **_: object
    ) -> None:
        super().__init__()
        self.cfg = cfg
        feature_dim = cfg.feature_dim
        if feature_dim == 0:
            enc = encoders[cfg.modality] if encoders and cfg.modality in encoders else None
            feature_dim = int(getattr(enc, "feature_dim", 0))
            if feature_dim < 1:
                raise ValueError(
                    f"mrfr.feature_dim is 0 and modality={cfg.modality!r} is not a region "
                    "encoder of this model: set mrfr.feature_dim"
                )
        self.head = _prediction_head(width, feature_dim, cfg.layer_norm_eps)
        init_weights(self)

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        if "region_masked" not in batch:
            return {}
        h_MD, masked_BR = self.masked_hidden(out, batch)
        pred_MF = self.head(h_MD).float()
        target_MF = batch["region_target_feats"][masked_BR].float()
        if pred_MF.shape[-1] != target_MF.shape[-1]:
            raise ValueError(
                f"mrfr predicts {pred_MF.shape[-1]} features, the batch has {target_MF.shape[-1]}"
            )
        n = pred_MF.shape[0]
        loss = (pred_MF - target_MF).pow(2).sum() / max(n, 1)
        return {"loss": loss}
