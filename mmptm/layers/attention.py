"""The one attention module of mmptm: self- and cross-attention over SDPA.

Legend: B batch, Q query length, K key length, D width, H heads, E head width (D / H).
Masks are booleans with True = real token (the project-wide convention): a key-padding
mask [B,K], or a per-sample visibility matrix [B,Q,K] (True = query q may see key k; K-BERT's
visible matrix, ERNIE's entity attention) that SDPA broadcasts over the heads.

Incremental decoding passes a ``KVCache``: a self-attention cache grows by the keys/values of
each call's new positions, a cross-attention (``static``) one holds the context's keys/values,
projected once on the first call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def key_padding_mask(mask_BK: torch.Tensor | None) -> torch.Tensor | None:
    """Turn a [B,K] keep-mask into the [B,1,1,K] boolean mask SDPA broadcasts over heads/queries,
    or a [B,Q,K] visibility matrix into [B,1,Q,K]."""
    if mask_BK is None:
        return None
    if mask_BK.dim() == 3:
        return mask_BK[:, None].bool()
    return mask_BK[:, None, None, :].bool()


def causal_mask(Q: int, K: int, device: torch.device) -> torch.Tensor:
    """[Q,K] boolean mask letting query i see keys 0..K-Q+i: the Q queries are the last Q
    positions of the K keys (Q == K without a cache, fewer when earlier keys are cached)."""
    return torch.ones(Q, K, dtype=torch.bool, device=device).tril(K - Q)


@dataclass
class KVCache:
    """Keys and values ``[B,H,K,E]`` one Attention computed on earlier calls.

    ``static=False`` (self-attention): each call appends the keys/values of its new positions.
    ``static=True`` (cross-attention): the first call projects the context, later calls reuse
    it and need no context. Rows are reordered in place for beam search.
    """

    static: bool = False
    k_BHKE: torch.Tensor | None = None
    v_BHKE: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Keys cached so far."""
        return 0 if self.k_BHKE is None else self.k_BHKE.shape[2]

    def reorder(self, index_B: torch.Tensor) -> None:
        """Take rows at ``index_B`` (may repeat rows, e.g. expanding inputs to beams)."""
        if self.k_BHKE is not None:
            self.k_BHKE = self.k_BHKE.index_select(0, index_B)
            self.v_BHKE = self.v_BHKE.index_select(0, index_B)


class Attention(nn.Module):
    """Multi-head attention backed by ``F.scaled_dot_product_attention``.

    Self-attention when ``x_BKD`` is None, cross-attention otherwise. ``kv_width`` lets the
    keys/values come from a stream of another width (ViLBERT co-attention). ``causal``
    self-attention lets each token see only itself and earlier tokens (CLIP's text tower),
    on top of the key-padding mask. ``mask_BK`` is a key-padding mask [B,K] or a visibility
    matrix [B,Q,K]; every query must see at least one key (SDPA gives NaN otherwise).
    """

    def __init__(
        self,
        width: int,
        heads: int,
        dropout: float = 0.0,
        kv_width: int | None = None,
        bias: bool = True,
        causal: bool = False,
    ) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        if causal and kv_width is not None:
            raise ValueError("causal attention is self-attention: it takes no kv_width")
        self.heads = heads
        self.dropout = dropout
        self.causal = causal
        kv_width = kv_width or width
        self.q = nn.Linear(width, width, bias=bias)
        self.k = nn.Linear(kv_width, width, bias=bias)
        self.v = nn.Linear(kv_width, width, bias=bias)
        self.out = nn.Linear(width, width, bias=bias)

    def _heads(self, proj: nn.Linear, x_BND: torch.Tensor) -> torch.Tensor:
        """Project and split into heads: [B,N,*] → [B,H,N,E]."""
        B, N = x_BND.shape[:2]
        return proj(x_BND).view(B, N, self.heads, -1).transpose(1, 2)

    def _mask(self, mask_BK: torch.Tensor | None, Q: int, K: int, device) -> torch.Tensor | None:
        """The boolean mask [B,1,Q,K] (or [B,1,1,K], [Q,K]) of allowed query-key pairs."""
        mask = key_padding_mask(mask_BK)
        if not self.causal:
            return mask
        tril_QK = causal_mask(Q, K, device)
        return tril_QK if mask is None else mask & tril_QK

    def weights(
        self,
        x_BQD: torch.Tensor,
        x_BKD: torch.Tensor | None = None,
        mask_BK: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The attention probabilities ``[B,H,Q,K]`` that ``forward`` uses (no dropout).

        Recomputed from the same projections, for inspection (attention maps, probes);
        masked keys get exactly 0.
        """
        kv_BKD = x_BQD if x_BKD is None else x_BKD
        q_BHQE, k_BHKE = self._heads(self.q, x_BQD), self._heads(self.k, kv_BKD)
        scores_BHQK = q_BHQE @ k_BHKE.transpose(-1, -2) / q_BHQE.shape[-1] ** 0.5
        mask = self._mask(mask_BK, q_BHQE.shape[2], k_BHKE.shape[2], x_BQD.device)
        if mask is not None:
            scores_BHQK = scores_BHQK.masked_fill(~mask, float("-inf"))
        return scores_BHQK.softmax(-1)

    def forward(
        self,
        x_BQD: torch.Tensor,
        x_BKD: torch.Tensor | None = None,
        mask_BK: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """With ``cache``, ``mask_BK`` covers every key: the cached ones and the new ones."""
        if self.causal and x_BKD is not None:
            raise ValueError("causal attention is self-attention: pass no x_BKD")
        if cache is not None:
            return self._forward_cached(x_BQD, x_BKD, mask_BK, cache)
        kv_BKD = x_BQD if x_BKD is None else x_BKD
        Q = x_BQD.shape[1]
        # Causal without padding: SDPA's own flag, which lets it pick a fused causal kernel.
        flag = self.causal and mask_BK is None
        return self._attend(
            self._heads(self.q, x_BQD),
            self._heads(self.k, kv_BKD),
            self._heads(self.v, kv_BKD),
            None if flag else self._mask(mask_BK, Q, kv_BKD.shape[1], x_BQD.device),
            flag,
        )

    def _attend(self, q_BHQE, k_BHKE, v_BHKE, mask, is_causal: bool) -> torch.Tensor:
        """SDPA over split heads, heads merged and projected out: [B,Q,D]."""
        o_BHQE = F.scaled_dot_product_attention(
            q_BHQE,
            k_BHKE,
            v_BHKE,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
        )
        B, H, Q, E = o_BHQE.shape
        o_BQD = o_BHQE.transpose(1, 2).reshape(B, Q, H * E)  # merge heads
        return self.out(o_BQD)

    def _forward_cached(
        self,
        x_BQD: torch.Tensor,
        x_BKD: torch.Tensor | None,
        mask_BK: torch.Tensor | None,
        cache: KVCache,
    ) -> torch.Tensor:
        """Attention whose keys/values come from (and, for self-attention, go to) ``cache``."""
        if mask_BK is not None and mask_BK.dim() != 2:
            raise ValueError("a cached attention takes a key-padding mask [B,K], not a matrix")
        if cache.static:
            if cache.k_BHKE is None:
                if x_BKD is None:
                    raise ValueError("an empty cross-attention cache needs the context x_BKD")
                cache.k_BHKE, cache.v_BHKE = self._heads(self.k, x_BKD), self._heads(self.v, x_BKD)
        else:
            if x_BKD is not None:
                raise ValueError("a self-attention cache takes no x_BKD")
            k_BHQE, v_BHQE = self._heads(self.k, x_BQD), self._heads(self.v, x_BQD)
            if cache.k_BHKE is None:
                cache.k_BHKE, cache.v_BHKE = k_BHQE, v_BHQE
            else:  # append the new positions after the cached ones
                cache.k_BHKE = torch.cat([cache.k_BHKE, k_BHQE], dim=2)
                cache.v_BHKE = torch.cat([cache.v_BHKE, v_BHQE], dim=2)
        Q, K = x_BQD.shape[1], cache.length
        # Causal without padding: SDPA's flag when nothing was cached (as the uncached call);
        # one new query sees every key, so it needs no mask at all.
        flag = self.causal and mask_BK is None and Q == K
        needs_mask = mask_BK is not None or (self.causal and Q > 1 and not flag)
        mask = self._mask(mask_BK, Q, K, x_BQD.device) if needs_mask else None
        return self._attend(self._heads(self.q, x_BQD), cache.k_BHKE, cache.v_BHKE, mask, flag)
