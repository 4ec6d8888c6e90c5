"""Transformer blocks (pre- or post-LayerNorm) built on the one Attention module.

Legend: B batch, N tokens, D width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mmptm.layers.attention import Attention


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


class TransformerBlock(nn.Module):
    """Self-attention + MLP, optionally with cross-attention to another stream in between."""

    def __init__(
        self,
        width: int,
        cfg: TransformerConfig,
        cross_width: int | None = None,
    ) -> None:
        super().__init__()
        eps = cfg.layer_norm_eps
        self.prenorm = cfg.prenorm
        self.attn = Attention(width, cfg.heads, cfg.attn_dropout)
        self.norm1 = nn.LayerNorm(width, eps=eps)
        self.cross: Attention | None = None
        if cross_width is not None:
            self.cross = Attention(width, cfg.heads, cfg.attn_dropout, kv_width=cross_width)
            self.norm_cross = nn.LayerNorm(width, eps=eps)
        hidden = int(width * cfg.mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
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
    ) -> torch.Tensor:
        x_BND = self._residual(x_BND, self.norm1, lambda h: self.attn(h, mask_BK=mask_BN))
        if self.cross is not None:
            if ctx_BMC is None:
                raise ValueError("this block has cross-attention: pass ctx_BMC")
            x_BND = self._residual(
                x_BND, self.norm_cross, lambda h: self.cross(h, ctx_BMC, ctx_mask_BM)
            )
        return self._residual(x_BND, self.norm2, self.mlp)


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
