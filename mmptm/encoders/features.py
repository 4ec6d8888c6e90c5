"""Pre-extracted video features and visual words as tokens (CBT, VideoBERT, HuBERT units).

- ``video_features`` reads ``features [B,T,F]`` and ``features_mask [B,T]`` (the features
  plug-in: one vector per frame or clip, e.g. S3D's 1024-d) and embeds each step as
  ``LN(W f)``; it declares the plug-in's fact ``dim`` (F).
- ``units`` reads ``unit_ids [B,T]`` and ``unit_mask [B,T]``: each step's nearest centroid
  in a k-means codebook (VideoBERT's visual words, HuBERT's units), embedded from a table of
  K rows. K is read from the codebook ``.npy`` [K,F] at build time; the encoder declares the
  codebook path (fact ``codebook``) so the plug-in maps features to the same ids.

Both then run :class:`~mmptm.encoders.temporal.TemporalStage`: a learned [MASK] embedding at
the positions an objective marks in ``<prefix>features_masked`` / ``<prefix>unit_masked``,
zero-initialised temporal positions and optional Transformer layers over time.

Legend: B batch, T time steps, F feature dim, K codebook size, D fusion width.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import nn

from mmptm.encoders.base import Encoder, ModalityTokens, init_weights
from mmptm.encoders.temporal import TemporalStage, frame_mask
from mmptm.modalities.base import Need
from mmptm.registry import ENCODERS


def codebook_size(path: str | Path) -> int:
    """K, the rows of a codebook ``.npy`` [K,F] (read from the header, not loaded)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"codebook not found: {path} (write one with `mmptm units fit`)")
    try:
        shape = np.load(path, mmap_mode="r").shape
    except (ValueError, OSError) as e:
        raise ValueError(f"{path}: not a .npy codebook ({e})") from None
    if len(shape) != 2 or shape[0] < 1:
        raise ValueError(f"{path}: a codebook is a [K,F] array, got shape {shape}")
    return int(shape[0])


@ENCODERS.register("video_features")
class VideoFeaturesEncoder(Encoder):
    """``LN(W f)`` per time step + :class:`TemporalStage`; reads ``features [B,T,F]``."""

    modality = "features"
    main_key = "features"

    @dataclass
    class Config:
        type: str = "video_features"
        #: F, the feature dimension (declared to the plug-in as its fact ``dim``)
        feature_dim: int = 1024
        max_frames: int = 64
        temporal_layers: int = 0
        temporal_heads: int = 4
        #: multiplier of the (zero-initialised) temporal position table: its effective
        #: learning rate, against tokens that are layer-normed to about 1 per channel
        temporal_pos_scale: float = 16.0
        dropout: float = 0.1
        layer_norm_eps: float = 1e-12
        #: a learned [MASK] embedding for masked steps (off when no objective masks them)
        mask_embedding: bool = True

    def __init__(self, cfg: Config, *, width: int, name: str = "features", **_: object) -> None:
        super().__init__(width, name)
        if cfg.feature_dim < 1:
            raise ValueError(f"encoder {name!r}: feature_dim must be >= 1, got {cfg.feature_dim}")
        self.cfg = cfg
        self.feature_dim = cfg.feature_dim
        self.proj = nn.Linear(cfg.feature_dim, width)
        self.norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        init_weights(self)
        self.temporal = TemporalStage.of(cfg, width, f"{self.prefix}features_masked")

    def data_needs(self) -> dict[str, Need]:
        return {self.view: Need(self.modality, {"dim": self.cfg.feature_dim})}

    def forward(self, batch: dict) -> ModalityTokens:
        f_BTF = batch[self.input_key]
        if f_BTF.ndim != 3 or f_BTF.shape[-1] != self.feature_dim:
            raise ValueError(
                f"{self.input_key} must be [B,T,{self.feature_dim}] (encoder {self.view!r} "
                f"feature_dim), got {tuple(f_BTF.shape)}"
            )
        real_BT = frame_mask(batch, f"{self.input_key}_mask", f_BTF.shape[:2], f_BTF.device)
        x_BTD = self.drop(self.norm(self.proj(f_BTF.to(self.proj.weight.dtype))))
        masked_BT = batch.get(f"{self.prefix}features_masked")
        x_BTD = self.temporal(x_BTD.unsqueeze(2), real_BT, masked_BT).squeeze(2)
        return ModalityTokens(self.add_type(x_BTD), real_BT)


@ENCODERS.register("units")
class UnitsEncoder(Encoder):
    """Embedding of K codebook ids + :class:`TemporalStage`; reads ``unit_ids [B,T]``."""

    modality = "units"
    main_key = "unit_ids"

    @dataclass
    class Config:
        type: str = "units"
        #: the codebook ``.npy`` [K,F] (``mmptm units fit``); K = its rows
        codebook: str = ""
        #: K without a codebook file (tests); must equal the codebook's rows if both are set
        num_units: int = 0
        max_frames: int = 64
        temporal_layers: int = 0
        temporal_heads: int = 4
        #: multiplier of the (zero-initialised) temporal position table: its effective
        #: learning rate, against tokens that are layer-normed to about 1 per channel
        temporal_pos_scale: float = 16.0
        dropout: float = 0.1
        layer_norm_eps: float = 1e-12
        #: a learned [MASK] embedding for masked steps (off when no objective masks them)
        mask_embedding: bool = True

    def __init__(self, cfg: Config, *, width: int, name: str = "units", **_: object) -> None:
        super().__init__(width, name)
        self.cfg = cfg
        k = codebook_size(cfg.codebook) if cfg.codebook else cfg.num_units
        if cfg.codebook and cfg.num_units and cfg.num_units != k:
            raise ValueError(
                f"encoder {name!r}: num_units={cfg.num_units} but {cfg.codebook} has {k} rows"
            )
        if k < 1:
            raise ValueError(f"encoder {name!r} needs a codebook (or num_units for tests)")
        self.num_units = k
        self.unit = nn.Embedding(k, width)
        self.norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        init_weights(self)
        self.temporal = TemporalStage.of(cfg, width, f"{self.prefix}unit_masked")

    def data_needs(self) -> dict[str, Need]:
        facts = {"codebook": self.cfg.codebook} if self.cfg.codebook else {}
        return {self.view: Need(self.modality, facts)}

    def forward(self, batch: dict) -> ModalityTokens:
        ids_BT = batch[self.input_key]
        real_BT = frame_mask(batch, f"{self.prefix}unit_mask", ids_BT.shape, ids_BT.device)
        bad = real_BT & ((ids_BT < 0) | (ids_BT >= self.num_units))
        if bool(bad.any()):
            raise ValueError(
                f"{self.input_key} holds ids outside [0, {self.num_units}) (encoder "
                f"{self.view!r}): was the batch made with another codebook?"
            )
        x_BTD = self.drop(self.norm(self.unit(ids_BT.masked_fill(~real_BT, 0))))
        masked_BT = batch.get(f"{self.prefix}unit_masked")
        x_BTD = self.temporal(x_BTD.unsqueeze(2), real_BT, masked_BT).squeeze(2)
        return ModalityTokens(self.add_type(x_BTD), real_BT)
