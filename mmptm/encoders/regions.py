"""Image regions as tokens: detector features (UNITER, LXMERT, ViLBERT) or RoI-pooled CNN maps.

Both encoders embed a region as ``LN(W f) + LN(W_p g)`` (one :class:`RegionEmbedding`), where
f is the region's feature vector and g its 7 box-geometry values (x1, y1, x2, y2, w, h, area)
from the normalised box, then dropout and the modality-type embedding.

- ``regions`` reads precomputed features: ``region_feats [B,R,F]``, ``region_boxes [B,R,4]``
  (normalised x1,y1,x2,y2), ``region_mask [B,R]`` (True = real).
- ``roi_regions`` computes f on the fly: a timm CNN (``features_only``) maps ``pixels`` to
  feature maps, ``torchvision.ops.roi_align`` pools each box, and the pooled bins are averaged.

Padded regions (mask False) get zero features and a dummy full-image box before anything is
computed, so garbage or degenerate padding can neither break ``roi_align`` nor put NaNs into
the (masked) tokens that attention still multiplies by zero.

Legend: B batch, R regions, F region feature dim, G=7 geometry values, C backbone channels,
h×w feature map, o RoI output size, D fusion width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torchvision.ops import roi_align

from mmptm.encoders.backbone import BackboneConfig, input_facts, timm_backbone
from mmptm.encoders.base import Encoder, ModalityTokens, init_weights
from mmptm.modalities.base import Need
from mmptm.registry import ENCODERS

#: x1, y1, x2, y2, w, h, area (UNITER's 7-d location feature); fixed, not configurable
LOCATION_DIM = 7

_DUMMY_BOX = (0.0, 0.0, 1.0, 1.0)


def box_geometry(boxes_BR4: torch.Tensor) -> torch.Tensor:
    """Geometry [B,R,7] = (x1, y1, x2, y2, w, h, w·h) of normalised boxes."""
    x1, y1, x2, y2 = boxes_BR4.unbind(-1)
    w, h = x2 - x1, y2 - y1
    return torch.stack([x1, y1, x2, y2, w, h, w * h], dim=-1)


def region_mask(batch: dict, boxes_BR4: torch.Tensor, key: str = "region_mask") -> torch.Tensor:
    """``region_mask`` as bool [B,R]; all regions real when the batch has none."""
    mask_BR = batch.get(key)
    if mask_BR is None:
        return torch.ones(boxes_BR4.shape[:2], dtype=torch.bool, device=boxes_BR4.device)
    return mask_BR.bool()


def safe_boxes(boxes_BR4: torch.Tensor, mask_BR: torch.Tensor) -> torch.Tensor:
    """Boxes with padded ones replaced by the full image (valid for roi_align, never NaN)."""
    dummy = boxes_BR4.new_tensor(_DUMMY_BOX)
    return torch.where(mask_BR.unsqueeze(-1), boxes_BR4, dummy)


class RegionEmbedding(nn.Module):
    """``dropout(LN(W f) + LN(W_p g))``: the region embedding both region encoders share."""

    def __init__(
        self, feature_dim: int, width: int, *, dropout: float, layer_norm_eps: float
    ) -> None:
        super().__init__()
        if feature_dim < 1:
            raise ValueError(f"region feature_dim must be >= 1, got {feature_dim}")
        self.feature_dim = feature_dim
        self.feat_proj = nn.Linear(feature_dim, width)
        self.feat_norm = nn.LayerNorm(width, eps=layer_norm_eps)
        self.loc_proj = nn.Linear(LOCATION_DIM, width)
        self.loc_norm = nn.LayerNorm(width, eps=layer_norm_eps)
        self.drop = nn.Dropout(dropout)
        init_weights(self)

    def forward(
        self, feats_BRF: torch.Tensor, boxes_BR4: torch.Tensor, mask_BR: torch.Tensor
    ) -> torch.Tensor:
        if feats_BRF.shape[-1] != self.feature_dim:
            raise ValueError(
                f"region features have dim {feats_BRF.shape[-1]}, the encoder expects "
                f"feature_dim={self.feature_dim}"
            )
        dtype = self.feat_proj.weight.dtype  # shards may store float16 features
        real_BR1 = mask_BR.unsqueeze(-1)
        feats_BRF = torch.where(real_BR1, feats_BRF.to(dtype), 0.0)
        geo_BRG = box_geometry(safe_boxes(boxes_BR4, mask_BR).to(dtype))
        x_BRD = self.feat_norm(self.feat_proj(feats_BRF)) + self.loc_norm(self.loc_proj(geo_BRG))
        return self.drop(x_BRD)


@ENCODERS.register("regions")
class RegionEncoder(Encoder):
    """Precomputed detector region features (bottom-up attention style) at the fusion width."""

    modality = "regions"
    main_key = "region_feats"

    @dataclass
    class Config:
        type: str = "regions"
        #: F of ``region_feats`` (2048 for bottom-up-attention Faster R-CNN features)
        feature_dim: int = 2048
        dropout: float = 0.1
        layer_norm_eps: float = 1e-12

    def __init__(self, cfg: Config, *, width: int, name: str = "regions", **_: object) -> None:
        super().__init__(width, name)
        self.cfg = cfg
        self.embed = RegionEmbedding(
            cfg.feature_dim, width, dropout=cfg.dropout, layer_norm_eps=cfg.layer_norm_eps
        )

    @property
    def feature_dim(self) -> int:
        return self.embed.feature_dim

    def forward(self, batch: dict) -> ModalityTokens:
        p = self.prefix
        feats_BRF, boxes_BR4 = batch[f"{p}region_feats"], batch[f"{p}region_boxes"]
        if boxes_BR4.shape[:2] != feats_BRF.shape[:2] or boxes_BR4.shape[-1] != 4:
            raise ValueError(
                f"{p}region_boxes {tuple(boxes_BR4.shape)} do not fit {p}region_feats "
                f"{tuple(feats_BRF.shape)} (want [B,R,4])"
            )
        mask_BR = region_mask(batch, boxes_BR4, f"{p}region_mask")
        x_BRD = self.embed(feats_BRF, boxes_BR4, mask_BR)
        return ModalityTokens(self.add_type(x_BRD), mask_BR)


@ENCODERS.register("roi_regions")
class RoIRegionEncoder(Encoder):
    """Regions RoI-aligned from a timm CNN's feature map(s); reads ``pixels`` + ``region_boxes``.

    With several ``out_indices`` each map is pooled and the channels are concatenated. The
    boxes come from its own view of the regions modality, the pixels from the ``image`` view.
    """

    modality = "regions"
    main_key = "region_boxes"
    #: the image view whose pixels the boxes are pooled from
    image_view = "image"

    @dataclass
    class Config:
        type: str = "roi_regions"
        #: the timm CNN (built with features_only=True), its weights, and the image size,
        #: mean and std it takes
        backbone: BackboneConfig = field(default_factory=BackboneConfig)
        #: which backbone stages to pool (timm ``out_indices``); default the last
        out_indices: list[int] = field(default_factory=lambda: [-1])
        #: roi_align output grid (o×o bins), averaged into one vector per region
        output_size: int = 7
        sampling_ratio: int = 2
        dropout: float = 0.1
        layer_norm_eps: float = 1e-12

    def __init__(self, cfg: Config, *, width: int, name: str = "regions", **_: object) -> None:
        super().__init__(width, name)
        self.cfg = cfg
        if not cfg.out_indices:
            raise ValueError("roi_regions.out_indices must name at least one backbone stage")
        if cfg.output_size < 1:
            raise ValueError(f"roi_regions.output_size must be >= 1, got {cfg.output_size}")
        self.backbone = timm_backbone(
            cfg.backbone, features_only=True, out_indices=tuple(cfg.out_indices)
        )
        channels = sum(self.backbone.feature_info.channels())
        self.embed = RegionEmbedding(
            channels, width, dropout=cfg.dropout, layer_norm_eps=cfg.layer_norm_eps
        )

    @property
    def feature_dim(self) -> int:
        return self.embed.feature_dim

    def has_input(self, batch: dict) -> bool:
        return self.input_key in batch and "pixels" in batch

    def data_needs(self) -> dict[str, Need]:
        facts = input_facts(self.backbone, self.cfg.backbone)
        return {self.view: Need(self.modality), self.image_view: Need("image", facts)}

    def pool_regions(
        self, pixels_B3HW: torch.Tensor, boxes_BR4: torch.Tensor, mask_BR: torch.Tensor
    ) -> torch.Tensor:
        """RoI-aligned, bin-averaged backbone features [B,R,C] of the (normalised) boxes."""
        B, R = boxes_BR4.shape[:2]
        maps = self.backbone(pixels_B3HW)
        # Boxes in input pixels; spatial_scale maps them onto each (square) feature map.
        boxes_px_BR4 = safe_boxes(boxes_BR4, mask_BR) * pixels_B3HW.shape[-1]
        pooled = []
        for fmap_BChw in maps:
            rois = list(boxes_px_BR4.to(fmap_BChw.dtype).unbind(0))
            bins_KCoo = roi_align(
                fmap_BChw,
                rois,
                output_size=self.cfg.output_size,
                spatial_scale=fmap_BChw.shape[-1] / pixels_B3HW.shape[-1],
                sampling_ratio=self.cfg.sampling_ratio,
                aligned=True,
            )
            pooled.append(bins_KCoo.mean(dim=(2, 3)).view(B, R, -1))
        return torch.cat(pooled, dim=-1)

    def forward(self, batch: dict) -> ModalityTokens:
        p = self.prefix
        pixels_B3HW, boxes_BR4 = batch["pixels"], batch[f"{p}region_boxes"]
        size = self.cfg.backbone.image_size
        if pixels_B3HW.shape[-2:] != (size, size):
            raise ValueError(
                f"pixels are {tuple(pixels_B3HW.shape[-2:])}, encoder {self.view!r} expects "
                f"backbone.image_size={size}"
            )
        if boxes_BR4.ndim != 3 or boxes_BR4.shape[-1] != 4:
            raise ValueError(f"{p}region_boxes must be [B,R,4], got {tuple(boxes_BR4.shape)}")
        mask_BR = region_mask(batch, boxes_BR4, f"{p}region_mask")
        feats_BRC = self.pool_regions(pixels_B3HW, boxes_BR4, mask_BR)
        x_BRD = self.embed(feats_BRC, boxes_BR4, mask_BR)
        return ModalityTokens(self.add_type(x_BRD), mask_BR)
