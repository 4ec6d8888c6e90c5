"""Two-stream fusion: ViLBERT co-attention and LXMERT cross-modality layers.

Each modality keeps its own Transformer stream (own width, heads and FFN size); the streams
exchange information only through cross-attention sublayers in which each stream's queries
attend to the other stream's keys/values, both computed from the states *before* either
stream is updated. Every layer, joins included, is the shared ``TransformerBlock``; a join
pairs one block per stream, differing only in its sublayer order.

- ``vilbert``: language and vision stacks of regular layers (TRM) with co-attention blocks
  (co-TRM: co-attention + Add&Norm, then FFN + Add&Norm per stream) between them. A
  connection ``[l, v]`` runs a co-TRM once the language stream has run ``l`` layers and the
  vision stream ``v`` layers, i.e. right before language layer ``l`` and vision layer ``v``
  (the ``t_biattention_id`` / ``v_biattention_id`` convention of the ViLBERT code), so a
  co-TRM is followed by the regular TRM blocks as in the paper's figure.
- ``lxmert``: a language encoder and an object-relationship encoder, then cross-modality
  layers: bidirectional cross-attention (one module shared by both directions when the
  streams have equal width and heads), then self-attention, then FFN, per stream.

Legend: B batch, L language tokens, R vision tokens (regions or patches), D model width,
W language-stream width, V vision-stream width, H heads, E head width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import ModalityTokens, init_weights
from mmptm.fusion.base import Fusion, FusionOutput, pool
from mmptm.layers import TransformerBlock, TransformerConfig
from mmptm.registry import FUSIONS

_DEFAULT_LAYERS = {"vilbert": (12, 6), "lxmert": (9, 5)}  # (language, vision/object)


class StreamJoin(nn.Module):
    """A TransformerBlock per stream, each cross-attending to the other stream's join input.

    Sublayers per stream: cross → MLP (ViLBERT's co-TRM) or cross → self → MLP (LXMERT's
    cross-modality layer). Both directions read the states from *before* the join; pre-LN,
    the keys/values are those states as the other block's ``norm_cross`` normalises them,
    i.e. the other stream's own (normalised) cross-attention queries.
    """

    def __init__(self, lang: TransformerBlock, vis: TransformerBlock) -> None:
        super().__init__()
        self.lang = lang
        self.vis = vis

    @staticmethod
    def _context(block: TransformerBlock, x_BND: torch.Tensor) -> torch.Tensor:
        """The states ``block``'s stream offers the other stream's cross-attention."""
        return block.norm_cross(x_BND) if block.prenorm else x_BND

    def forward(
        self,
        l_BLW: torch.Tensor,
        l_mask_BL: torch.Tensor,
        v_BRV: torch.Tensor,
        v_mask_BR: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cl_BLW, cv_BRV = self._context(self.lang, l_BLW), self._context(self.vis, v_BRV)
        return (
            self.lang(l_BLW, l_mask_BL, cv_BRV, v_mask_BR),
            self.vis(v_BRV, v_mask_BR, cl_BLW, l_mask_BL),
        )


@FUSIONS.register("two_stream")
class TwoStreamFusion(Fusion):
    """Per-modality streams joined by co-attention (ViLBERT) or cross-modality layers (LXMERT).

    ``hidden``/``pooled`` hold the language and vision modalities at width D;
    ``pooled["joint"]`` is the product of the two pooled vectors (ViLBERT) or the language
    [CLS] pooled vector (LXMERT).
    """

    @dataclass
    class Config:
        type: str = "two_stream"
        #: encoder names of the two streams (vision may be ``regions`` or ``image``)
        language: str = "text"
        vision: str = "regions"
        variant: Literal["vilbert", "lxmert"] = "vilbert"
        #: regular layers of the language stream; None = 12 (vilbert) or 9 (lxmert)
        language_layers: int | None = None
        #: vilbert: regular layers of the vision stream; None = 6
        vision_layers: int | None = None
        #: vilbert: [language_layers_run, vision_layers_run] before each co-TRM block;
        #: None = the last min(L, V) language layers paired with vision layers 0.. (ViLBERT-base:
        #: [[6, 0], ..., [11, 5]]); [] = no co-attention (independent streams)
        connections: list[list[int]] | None = None
        #: lxmert: object-relationship layers (None = 5) and cross-modality layers (None = 5)
        object_layers: int | None = None
        cross_layers: int | None = None
        #: stream widths; 0 = the model width D, otherwise projected in and back out to D
        language_width: int = 0
        vision_width: int = 0
        language_heads: int = 12
        #: None = 8 (vilbert, its 1024-wide vision stream) or language_heads (lxmert)
        vision_heads: int | None = None
        #: FFN hidden size / stream width (ViLBERT's vision stream: 1024 → 1024, ratio 1)
        language_mlp_ratio: float = 4.0
        vision_mlp_ratio: float = 4.0
        dropout: float = 0.1
        attn_dropout: float = 0.1
        #: False = BERT post-LN, as in both papers
        prenorm: bool = False
        layer_norm_eps: float = 1e-12
        #: pooled[vision]: first token (ViLBERT's whole-image feature) or masked mean
        vision_pooling: Literal["first", "mean"] = "first"

        def __post_init__(self) -> None:
            self.check()

        def n_language(self) -> int:
            return _or(self.language_layers, _DEFAULT_LAYERS[self.variant][0])

        def n_vision(self) -> int:
            """Regular vision layers (vilbert) or object-relationship layers (lxmert)."""
            if self.variant == "vilbert":
                return _or(self.vision_layers, _DEFAULT_LAYERS["vilbert"][1])
            return _or(self.object_layers, _DEFAULT_LAYERS["lxmert"][1])

        def n_vision_heads(self) -> int:
            default = 8 if self.variant == "vilbert" else self.language_heads
            return _or(self.vision_heads, default)

        def n_cross(self) -> int:
            return _or(self.cross_layers, 5)

        def co_connections(self) -> list[tuple[int, int]]:
            """The resolved ViLBERT connections."""
            if self.connections is not None:
                return [(c[0], c[1]) for c in self.connections]
            L, V = self.n_language(), self.n_vision()
            return [(L - min(L, V) + i, i) for i in range(min(L, V))]

        def check(self) -> None:
            """Raise ValueError naming the first inconsistent setting."""
            if self.language == self.vision:
                raise ValueError(f"language and vision are both {self.language!r}")
            other = (
                {"object_layers": self.object_layers, "cross_layers": self.cross_layers}
                if self.variant == "vilbert"
                else {"vision_layers": self.vision_layers, "connections": self.connections}
            )
            for key, value in other.items():
                if value is not None:
                    raise ValueError(f"{key} does not apply to variant {self.variant!r}")
            sizes = {
                "language_layers": self.language_layers,
                "vision_layers": self.vision_layers,
                "object_layers": self.object_layers,
                "cross_layers": self.cross_layers,
                "language_width": self.language_width,
                "vision_width": self.vision_width,
            }
            for key, value in sizes.items():
                if value is not None and value < 0:
                    raise ValueError(f"{key} must be >= 0, got {value}")
            if self.variant == "vilbert":
                self._check_connections()

        def _check_connections(self) -> None:
            L, V = self.n_language(), self.n_vision()
            prev = (0, 0)
            for pair in self.connections or []:
                where = f"connection {pair} (language_layers={L}, vision_layers={V})"
                if len(pair) != 2:
                    raise ValueError(f"{where}: expected [language_index, vision_index]")
                lc, vc = pair
                if not (0 <= lc <= L and 0 <= vc <= V):
                    raise ValueError(
                        f"{where}: indices must lie in 0..{L} and 0..{V} "
                        "(layers of each stream run before the co-attention block)"
                    )
                if lc < prev[0] or vc < prev[1]:
                    raise ValueError(f"{where}: connections must be in non-decreasing order")
                prev = (lc, vc)

    def __init__(
        self, cfg: Config, *, width: int, modalities: list[str] | None = None, **_: object
    ) -> None:
        super().__init__()
        cfg.check()
        self.cfg = cfg
        self.streams = (cfg.language, cfg.vision)
        if modalities is not None:
            missing = [m for m in self.streams if m not in modalities]
            extra = [m for m in modalities if m not in self.streams]
            if missing or extra:
                what = f"no encoder for {missing}" if missing else f"encoders {extra} unused"
                raise ValueError(
                    f"two_stream fusion joins {cfg.language!r} and {cfg.vision!r}: {what}; "
                    f"encoders: {modalities}"
                )
        W = cfg.language_width or width
        V = cfg.vision_width or width

        def stream_cfg(heads: int, ratio: float) -> TransformerConfig:
            return TransformerConfig(
                layers=0,
                heads=heads,
                mlp_ratio=ratio,
                dropout=cfg.dropout,
                attn_dropout=cfg.attn_dropout,
                prenorm=cfg.prenorm,
                layer_norm_eps=cfg.layer_norm_eps,
            )

        lang_tc = stream_cfg(cfg.language_heads, cfg.language_mlp_ratio)
        vis_tc = stream_cfg(cfg.n_vision_heads(), cfg.vision_mlp_ratio)

        self.lang_in = nn.Linear(width, W) if W != width else nn.Identity()
        self.vis_in = nn.Linear(width, V) if V != width else nn.Identity()
        self.lang_layers = nn.ModuleList(
            TransformerBlock(W, lang_tc) for _ in range(cfg.n_language())
        )
        self.vis_layers = nn.ModuleList(TransformerBlock(V, vis_tc) for _ in range(cfg.n_vision()))

        def join(sublayers: tuple[str, ...], share: bool = False) -> StreamJoin:
            lang = TransformerBlock(W, lang_tc, cross_width=V, sublayers=sublayers)
            vis = TransformerBlock(V, vis_tc, cross_width=W, sublayers=sublayers)
            if share:  # LXMERT: one cross-attention (and its norm) for both directions
                vis.cross, vis.norm_cross = lang.cross, lang.norm_cross
            return StreamJoin(lang, vis)

        if cfg.variant == "vilbert":
            self.joins = nn.ModuleList(join(("cross", "mlp")) for _ in cfg.co_connections())
        else:
            share = W == V and cfg.language_heads == cfg.n_vision_heads()
            self.joins = nn.ModuleList(
                join(("cross", "self", "mlp"), share) for _ in range(cfg.n_cross())
            )
        # Post-LN sublayers already end normalised; pre-LN streams need a closing norm.
        closing = [
            nn.LayerNorm(n, eps=cfg.layer_norm_eps) if cfg.prenorm else nn.Identity()
            for n in (W, V)
        ]
        self.lang_norm, self.vis_norm = closing
        self.lang_out = nn.Linear(W, width) if W != width else nn.Identity()
        self.vis_out = nn.Linear(V, width) if V != width else nn.Identity()
        self.lang_pooler = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        # LXMERT pools the language [CLS] alone; ViLBERT's joint vector needs both poolers.
        self.vis_pooler = (
            nn.Sequential(nn.Linear(width, width), nn.Tanh())
            if cfg.variant == "vilbert"
            else nn.Identity()
        )
        init_weights(self)

    def _streams(
        self,
        l_BLW: torch.Tensor,
        l_mask_BL: torch.Tensor,
        v_BRV: torch.Tensor,
        v_mask_BR: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run both streams at their own widths (the variant's layer schedule)."""
        li = vi = 0
        if self.cfg.variant == "vilbert":
            for (lc, vc), block in zip(self.cfg.co_connections(), self.joins):
                for layer in self.lang_layers[li:lc]:
                    l_BLW = layer(l_BLW, l_mask_BL)
                for layer in self.vis_layers[vi:vc]:
                    v_BRV = layer(v_BRV, v_mask_BR)
                li, vi = lc, vc
                l_BLW, v_BRV = block(l_BLW, l_mask_BL, v_BRV, v_mask_BR)
        for layer in self.lang_layers[li:]:
            l_BLW = layer(l_BLW, l_mask_BL)
        for layer in self.vis_layers[vi:]:
            v_BRV = layer(v_BRV, v_mask_BR)
        if self.cfg.variant == "lxmert":
            for layer in self.joins:
                l_BLW, v_BRV = layer(l_BLW, l_mask_BL, v_BRV, v_mask_BR)
        return self.lang_norm(l_BLW), self.vis_norm(v_BRV)

    def forward(
        self, tokens: dict[str, ModalityTokens], batch: Batch | None = None
    ) -> FusionOutput:
        extra = [m for m in tokens if m not in self.streams]
        missing = [m for m in self.streams if m not in tokens]
        if extra or missing:
            what = f"unexpected modalities {extra}" if extra else f"missing modalities {missing}"
            raise ValueError(
                f"two_stream fusion joins {self.cfg.language!r} and {self.cfg.vision!r}: {what}"
            )
        lang, vis = tokens[self.cfg.language], tokens[self.cfg.vision]
        l_BLW, v_BRV = self._streams(
            self.lang_in(lang.tokens), lang.mask, self.vis_in(vis.tokens), vis.mask
        )
        l_BLD, v_BRD = self.lang_out(l_BLW), self.vis_out(v_BRV)
        pooled_l_BD = self.lang_pooler(pool(l_BLD, lang.mask, "first"))
        pooled_v_BD = self.vis_pooler(pool(v_BRD, vis.mask, self.cfg.vision_pooling))
        joint_BD = pooled_l_BD * pooled_v_BD if self.cfg.variant == "vilbert" else pooled_l_BD
        return FusionOutput(
            hidden={self.cfg.language: l_BLD, self.cfg.vision: v_BRD},
            mask={self.cfg.language: lang.mask, self.cfg.vision: vis.mask},
            pooled={
                self.cfg.language: pooled_l_BD,
                self.cfg.vision: pooled_v_BD,
                "joint": joint_BD,
            },
        )


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
