"""Attention with a per-sample visibility matrix [B,Q,K] (K-BERT, ERNIE's entity attention)
equals attending to each query's visible keys alone."""

from __future__ import annotations

import torch

from mmptm.layers import Attention, TransformerBlock, TransformerConfig


def test_visible_matrix_equals_each_visible_set_alone():
    torch.manual_seed(0)
    attn = Attention(8, 2).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 8, generator=g)
    vis = torch.rand(2, 6, 6, generator=g) < 0.5
    vis |= torch.eye(6, dtype=torch.bool)  # every query sees at least itself
    out = attn(x, mask_BK=vis)
    for b in range(2):
        for q in range(6):
            keys = vis[b, q].nonzero().squeeze(1)
            # the query alone against its visible keys (cross-attention form)
            alone = attn(x[b : b + 1, q : q + 1], x[b : b + 1, keys])
            torch.testing.assert_close(out[b, q], alone[0, 0], atol=1e-6, rtol=1e-5)


def test_a_block_takes_a_visibility_matrix():
    torch.manual_seed(0)
    block = TransformerBlock(8, TransformerConfig(heads=2, dropout=0.0, attn_dropout=0.0)).eval()
    x = torch.randn(1, 4, 8)
    pad = torch.tensor([[True, True, True, False]])
    # a key-padding mask and the same as a matrix give the same result
    torch.testing.assert_close(block(x, pad), block(x, pad[:, None, :].expand(1, 4, 4)))
