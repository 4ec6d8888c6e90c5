"""A Transformer decoder (causal self-attention [→ cross-attention] → MLP) with a KV cache.

Legend: B batch, T target positions (new positions with a cache), M context tokens, D width,
C context width.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from mmptm.layers.attention import KVCache
from mmptm.layers.transformer import TransformerBlock, TransformerConfig


class DecoderCache:
    """What a ``TransformerDecoder`` keeps between incremental calls.

    Per layer: the self-attention keys/values of every position so far (growing) and the
    cross-attention keys/values of the context (computed on the first call); besides, the
    key-padding masks of both (None = every key real).
    """

    def __init__(self, layers: int, cross: bool) -> None:
        self.self_kv = [KVCache() for _ in range(layers)]
        self.cross_kv = [KVCache(static=True) for _ in range(layers)] if cross else None
        #: positions cached so far
        self.length = 0
        self.mask_BK: torch.Tensor | None = None
        self.ctx_mask_BM: torch.Tensor | None = None

    def reorder(self, index_B: torch.Tensor) -> None:
        """Take rows at ``index_B`` in place (beam reordering, or B rows expanded to beams:
        the index may be longer than B)."""
        for kv in self.self_kv + (self.cross_kv or []):
            kv.reorder(index_B)
        if self.mask_BK is not None:
            self.mask_BK = self.mask_BK.index_select(0, index_B)
        if self.ctx_mask_BM is not None:
            self.ctx_mask_BM = self.ctx_mask_BM.index_select(0, index_B)

    def _append_mask(self, mask_BT: torch.Tensor | None, B: int, T: int, device) -> None:
        """Extend the self-attention key mask by the new positions' mask."""
        if mask_BT is None and self.mask_BK is None:
            return
        if mask_BT is None:
            mask_BT = torch.ones(B, T, dtype=torch.bool, device=device)
        past_BK = self.mask_BK
        if past_BK is None:
            past_BK = torch.ones(B, self.length, dtype=torch.bool, device=device)
        self.mask_BK = torch.cat([past_BK, mask_BT.bool()], dim=1)


class TransformerDecoder(nn.Module):
    """``cfg.layers`` blocks of causal self-attention [→ cross-attention] → MLP.

    Cross-attention to a context of width ``cross_width`` (an encoder's or a fusion's
    states) only when it is given; a decoder-only LM otherwise. Self-attention is causal
    whatever ``cfg.causal`` says. A closing LayerNorm in the pre-LN layout, as
    ``TransformerStack``. Padding goes on the right of the target (a padded first position
    would see no key).
    """

    def __init__(self, width: int, cfg: TransformerConfig, cross_width: int | None = None) -> None:
        super().__init__()
        cfg = dataclasses.replace(cfg, causal=True)
        self.cross = cross_width is not None
        self.blocks = nn.ModuleList(
            TransformerBlock(width, cfg, cross_width=cross_width) for _ in range(cfg.layers)
        )
        # Post-LN blocks already end normalised; pre-LN ones need a closing norm.
        closing = cfg.prenorm and cfg.layers > 0
        self.norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps) if closing else nn.Identity()

    def new_cache(self) -> DecoderCache:
        """An empty cache for incremental decoding."""
        return DecoderCache(len(self.blocks), self.cross)

    def forward(
        self,
        x_BTD: torch.Tensor,
        mask_BT: torch.Tensor | None = None,
        ctx_BMC: torch.Tensor | None = None,
        ctx_mask_BM: torch.Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """Hidden states [B,T,D] of the target positions ``x_BTD``.

        Without ``cache``: the whole target, causal self-attention plus the key-padding mask
        ``mask_BT`` (True = real). With ``cache``: ``x_BTD`` (and ``mask_BT``) hold only the
        positions after ``cache.length``, which see the cached ones; the cache is updated in
        place. The context (``ctx_BMC``, ``ctx_mask_BM``) is needed on the first cached call
        only.
        """
        if self.cross and ctx_BMC is None and (cache is None or cache.length == 0):
            raise ValueError("this decoder has cross-attention: pass ctx_BMC")
        if cache is None:
            for block in self.blocks:
                x_BTD = block(x_BTD, mask_BT, ctx_BMC, ctx_mask_BM)
            return self.norm(x_BTD)
        B, T = x_BTD.shape[:2]
        if cache.length == 0 and ctx_mask_BM is not None:
            cache.ctx_mask_BM = ctx_mask_BM.bool()
        cache._append_mask(mask_BT, B, T, x_BTD.device)
        for i, block in enumerate(self.blocks):
            x_BTD = block(
                x_BTD,
                cache.mask_BK,
                ctx_BMC,
                cache.ctx_mask_BM,
                self_cache=cache.self_kv[i],
                cross_cache=None if cache.cross_kv is None else cache.cross_kv[i],
            )
        cache.length += T
        return self.norm(x_BTD)
