"""Transformer blocks (pre- or post-LayerNorm) built on the one Attention module.

Legend: B batch, N tokens, D width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mmptm.layers.attention import Attention, KVCache


@dataclass
class TransformerConfig:
    """Shape of a Transformer stack; ``prenorm=False`` is the BERT/XLM-R (post-LN) layout."""

    layers: int = 2
    heads: int = 4
    mlp_ratio: float = 4.0
    dropout: float = 0.1
    attn_dropout: float = 0.1
    prenorm: bool = True
    layer_norm_eps: float = 1e-12
    #: self-attention sees only earlier tokens (CLIP's text tower, pooled at its last token)
    causal: bool = False
    #: the MLP's activation: gelu (exact erf form) | quick_gelu (x·σ(1.702x), OpenAI CLIP)
    activation: str = "gelu"


class QuickGELU(nn.Module):
    """x·σ(1.702x): the GELU approximation OpenAI's CLIP models were trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


#: ``TransformerConfig.activation`` → the MLP's activation module
ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "quick_gelu": QuickGELU}


#: what a TransformerBlock can run, each as one residual sublayer with its own LayerNorm
SUBLAYERS = ("self", "cross", "mlp")


class TransformerBlock(nn.Module):
    """Residual sublayers run in the order ``sublayers`` names, each with its LayerNorm.

    ``self``: self-attention (``attn``, ``norm1``); ``cross``: cross-attention to another
    stream of width ``cross_width`` (``cross``, ``norm_cross``); ``mlp``: the FFN (``mlp``,
    ``norm2``). The default is self → MLP, or self → cross → MLP given ``cross_width``;
    two-stream fusion uses cross → MLP (ViLBERT co-TRM) and cross → self → MLP (LXMERT).
    """

    def __init__(
        self,
        width: int,
        cfg: TransformerConfig,
        cross_width: int | None = None,
        sublayers: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__()
        if sublayers is None:
            sublayers = ("self", "mlp") if cross_width is None else ("self", "cross", "mlp")
        unknown = [s for s in sublayers if s not in SUBLAYERS]
        if unknown or len(set(sublayers)) != len(sublayers) or not sublayers:
            raise ValueError(
                f"sublayers must name each of {SUBLAYERS} at most once, got {sublayers}"
            )
        if cfg.activation not in ACTIVATIONS:
            raise ValueError(
                f"transformer activation {cfg.activation!r} is unknown; choices: "
                f"{sorted(ACTIVATIONS)}"
            )
        if ("cross" in sublayers) != (cross_width is not None):
            raise ValueError(
                f"a cross sublayer needs cross_width and cross_width a cross sublayer; got "
                f"sublayers={sublayers}, cross_width={cross_width}"
            )
        self.sublayers = tuple(sublayers)
        eps = cfg.layer_norm_eps
        self.prenorm = cfg.prenorm
        # Created in this fixed order whatever the run order, so initialisation draws (and
        # thus seeded runs of existing models) do not depend on ``sublayers``.
        self.attn: Attention | None = None
        if "self" in sublayers:
            self.attn = Attention(width, cfg.heads, cfg.attn_dropout, causal=cfg.causal)
            self.norm1 = nn.LayerNorm(width, eps=eps)
        self.cross: Attention | None = None
        if cross_width is not None:
            self.cross = Attention(width, cfg.heads, cfg.attn_dropout, kv_width=cross_width)
            self.norm_cross = nn.LayerNorm(width, eps=eps)
        self.mlp: nn.Sequential | None = None
        if "mlp" in sublayers:
            hidden = int(width * cfg.mlp_ratio)
            act = ACTIVATIONS[cfg.activation]()
            self.mlp = nn.Sequential(nn.Linear(width, hidden), act, nn.Linear(hidden, width))
            self.norm2 = nn.LayerNorm(width, eps=eps)
        self.drop = nn.Dropout(cfg.dropout)

    def _residual(self, x: torch.Tensor, norm: nn.LayerNorm, fn) -> torch.Tensor:
        if self.prenorm:
            return x + self.drop(fn(norm(x)))
        return norm(x + self.drop(fn(x)))

    def forward(
        self,
        x_BND: torch.Tensor,
        mask_BN: torch.Tensor | None = None,
        ctx_BMC: torch.Tensor | None = None,
        ctx_mask_BM: torch.Tensor | None = None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
    ) -> torch.Tensor:
        """``mask_BN`` is a key-padding mask [B,N] or a visibility matrix [B,N,N] (see
        ``Attention``); ``ctx_BMC`` (with ``ctx_mask_BM``) is what the cross sublayer reads as
        keys/values.

        Incremental decoding: ``self_cache`` holds the self-attention's earlier keys/values
        (``x_BND`` is then the new positions only and ``mask_BN`` covers cached and new keys),
        ``cross_cache`` (static) the context's, so ``ctx_BMC`` is needed only to fill it.
        """
        cross_cached = cross_cache is not None and cross_cache.length > 0
        if self.cross is not None and ctx_BMC is None and not cross_cached:
            raise ValueError("this block has cross-attention: pass ctx_BMC")
        for sublayer in self.sublayers:
            if sublayer == "self":
                x_BND = self._residual(
                    x_BND, self.norm1, lambda h: self.attn(h, mask_BK=mask_BN, cache=self_cache)
                )
            elif sublayer == "cross":
                x_BND = self._residual(
                    x_BND,
                    self.norm_cross,
                    lambda h: self.cross(h, ctx_BMC, ctx_mask_BM, cache=cross_cache),
                )
            else:
                x_BND = self._residual(x_BND, self.norm2, self.mlp)
        return x_BND


class TransformerStack(nn.Module):
    """A stack of self-attention blocks with a final LayerNorm in the pre-LN layout."""

    def __init__(self, width: int, cfg: TransformerConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TransformerBlock(width, cfg) for _ in range(cfg.layers))
        # Post-LN blocks already end normalised; pre-LN ones need a closing norm.
        closing = cfg.prenorm and cfg.layers > 0
        self.norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps) if closing else nn.Identity()

    def forward(self, x_BND: torch.Tensor, mask_BN: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.blocks:
            x_BND = block(x_BND, mask_BN)
        return self.norm(x_BND)
