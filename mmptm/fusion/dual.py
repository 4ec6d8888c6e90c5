"""Dual encoders (CLIP): a Transformer tower per modality, no cross-modal layers.

Each modality is contextualised on its own and pooled; contrastive objectives compare the
pooled vectors. A tower of 0 layers passes the encoder's tokens through (a timm backbone is
already contextual). Towers share nothing, so each may run at its own width
(``model.widths``: an OpenCLIP ResNet's image tower at its embedding width, the text tower
at the text width).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import ModalityTokens, init_weights
from mmptm.fusion.base import POOLINGS, Fusion, FusionOutput, pool
from mmptm.layers import TransformerConfig, TransformerStack
from mmptm.registry import FUSIONS


@FUSIONS.register("dual")
class DualFusion(Fusion):
    """Independent per-modality towers; ``pooled[m]`` per modality and no ``joint``."""

    per_view_widths: ClassVar[bool] = True

    @dataclass
    class Config:
        type: str = "dual"
        transformer: TransformerConfig = field(default_factory=TransformerConfig)
        #: per-modality layer counts overriding ``transformer.layers``, e.g. {image: 0}
        layers: dict[str, int] = field(default_factory=dict)
        #: per-modality pooling (first | mean | last: the last real token); default mean
        pooling: dict[str, str] = field(default_factory=dict)
        #: views sharing one tower, e.g. {text2: text} (two languages, one encoder)
        tie_towers: dict[str, str] = field(default_factory=dict)

    def __init__(
        self,
        cfg: Config,
        *,
        width: int,
        modalities: list[str],
        widths: dict[str, int] | None = None,
        **_: object,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        named = (
            set(cfg.layers) | set(cfg.pooling) | set(cfg.tie_towers) | set(cfg.tie_towers.values())
        )
        unknown = named - set(modalities)
        if unknown:
            raise ValueError(
                f"dual fusion names modalities {sorted(unknown)} that have no encoder; "
                f"encoders: {modalities}"
            )
        bad = {m: how for m, how in cfg.pooling.items() if how not in POOLINGS}
        if bad:
            raise ValueError(f"dual fusion pooling {bad}: choices are {', '.join(POOLINGS)}")
        width_of = {m: (widths or {}).get(m, width) for m in modalities}
        for m, tower in cfg.tie_towers.items():
            if width_of[m] != width_of[tower]:
                raise ValueError(
                    f"dual fusion ties {m!r} to the tower of {tower!r}, but their widths "
                    f"differ ({width_of[m]} vs {width_of[tower]})"
                )
        self.towers = nn.ModuleDict(
            {
                m: TransformerStack(
                    width_of[m],
                    replace(cfg.transformer, layers=cfg.layers.get(m, cfg.transformer.layers)),
                )
                for m in modalities
                if m not in cfg.tie_towers
            }
        )
        init_weights(self)
        self.tower_of = {m: cfg.tie_towers.get(m, m) for m in modalities}

    def forward(
        self, tokens: dict[str, ModalityTokens], batch: Batch | None = None
    ) -> FusionOutput:
        hidden, mask, pooled = {}, {}, {}
        for m, t in tokens.items():
            hidden[m] = self.towers[self.tower_of[m]](t.tokens, t.mask)
            mask[m] = t.mask
            pooled[m] = pool(hidden[m], mask[m], self.cfg.pooling.get(m, "mean"))
        return FusionOutput(hidden, mask, pooled)
