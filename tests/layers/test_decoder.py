"""TransformerDecoder and its KV cache: incremental calls equal the full causal pass."""

from __future__ import annotations

import pytest
import torch

from mmptm.layers import Attention, KVCache, TransformerConfig, TransformerDecoder


def _decoder(cross: bool, prenorm: bool = True, seed: int = 0) -> TransformerDecoder:
    torch.manual_seed(seed)
    cfg = TransformerConfig(layers=3, heads=4, dropout=0.0, attn_dropout=0.0, prenorm=prenorm)
    return TransformerDecoder(16, cfg, cross_width=12 if cross else None).eval()


def _ctx(B: int, M: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ctx_BMC = torch.randn(B, M, 12, generator=g)
    ctx_mask_BM = torch.ones(B, M, dtype=torch.bool)
    ctx_mask_BM[0, 3:] = False  # row 0: 3 real context tokens, the rest padding
    ctx_mask_BM[2, 5:] = False
    return ctx_BMC, ctx_mask_BM


def _steps(dec, x_BTD, chunks, ctx_BMC=None, ctx_mask_BM=None, mask_BT=None):
    """The decoder run over ``x_BTD`` in consecutive chunks of the given sizes, cached."""
    cache, outs, start = dec.new_cache(), [], 0
    for n in chunks:
        sl = slice(start, start + n)
        mask = None if mask_BT is None else mask_BT[:, sl]
        outs.append(dec(x_BTD[:, sl], mask, ctx_BMC, ctx_mask_BM, cache=cache))
        start += n
        assert cache.length == start
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("cross", [True, False])
@pytest.mark.parametrize("prenorm", [True, False])
@pytest.mark.parametrize("chunks", [[1] * 8, [3, 1, 2, 1, 1]])
def test_cached_steps_equal_the_full_pass(cross: bool, prenorm: bool, chunks) -> None:
    g = torch.Generator().manual_seed(1)
    dec = _decoder(cross, prenorm)
    x_BTD = torch.randn(3, 8, 16, generator=g)
    ctx = _ctx(3, 7, g) if cross else (None, None)
    with torch.no_grad():
        full = dec(x_BTD, None, *ctx)
        got, _ = _steps(dec, x_BTD, chunks, *ctx)
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)


def test_full_pass_is_causal_each_position_equals_its_prefix_alone() -> None:
    """Independent of the cache: position t's output is the last output of the decoder run on
    positions 0..t alone (where no key lies in its future)."""
    g = torch.Generator().manual_seed(2)
    dec = _decoder(True)
    x_BTD = torch.randn(3, 6, 16, generator=g)
    ctx = _ctx(3, 7, g)
    with torch.no_grad():
        full = dec(x_BTD, None, *ctx)
        for t in range(6):
            alone = dec(x_BTD[:, : t + 1], None, *ctx)[:, -1]
            torch.testing.assert_close(full[:, t], alone, rtol=1e-5, atol=1e-5)
        # Context padding: what sits behind a padded context token changes nothing.
        ctx2 = ctx[0].clone()
        ctx2[0, 3:] = 99.0
        torch.testing.assert_close(dec(x_BTD, None, ctx2, ctx[1]), full, rtol=0, atol=0)


def test_target_padding_cached_equals_full_on_real_positions() -> None:
    g = torch.Generator().manual_seed(3)
    dec = _decoder(True)
    x_BTD = torch.randn(3, 7, 16, generator=g)
    mask_BT = torch.ones(3, 7, dtype=torch.bool)
    mask_BT[1, 4:] = False  # right padding
    mask_BT[2, 6:] = False
    ctx = _ctx(3, 5, g)
    with torch.no_grad():
        full = dec(x_BTD, mask_BT, *ctx)
        got, cache = _steps(dec, x_BTD, [2, 1, 1, 3], *ctx, mask_BT=mask_BT)
        # Real positions do not see what the padding holds.
        x2 = x_BTD.masked_fill(~mask_BT[..., None], 5.0)
        full2 = dec(x2, mask_BT, *ctx)
    torch.testing.assert_close(got[mask_BT], full[mask_BT], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(full2[mask_BT], full[mask_BT], rtol=0, atol=0)
    assert torch.equal(cache.mask_BK, mask_BT)


def test_reorder_takes_rows_like_the_full_pass_on_reordered_rows() -> None:
    """Expand 2 rows to 5 (index longer than B), step, reorder again, step: each row equals
    the full pass of the prefix it ended up with and the context of the row it came from."""
    g = torch.Generator().manual_seed(4)
    dec = _decoder(True)
    ctx_BMC, ctx_mask_BM = _ctx(3, 6, g)
    ctx_BMC, ctx_mask_BM = ctx_BMC[:2], ctx_mask_BM[:2]
    x_BTD = torch.randn(2, 2, 16, generator=g)
    expand = torch.tensor([0, 0, 1, 1, 1])
    later_5TD = torch.randn(5, 3, 16, generator=g)
    beam = torch.tensor([4, 0, 0, 2, 3])
    with torch.no_grad():
        cache = dec.new_cache()
        dec(x_BTD, None, ctx_BMC, ctx_mask_BM, cache=cache)
        cache.reorder(expand)
        a = dec(later_5TD[:, :1], cache=cache)  # the context is cached: none passed
        cache.reorder(beam)
        b = dec(later_5TD[:, 1:], cache=cache)
        src = expand[beam]
        prefix = torch.cat([x_BTD[src], later_5TD[beam, :1], later_5TD[:, 1:]], dim=1)
        full = dec(prefix, None, ctx_BMC[src], ctx_mask_BM[src])
        full_a = dec(
            torch.cat([x_BTD[expand], later_5TD[:, :1]], 1),
            None,
            *(t[expand] for t in (ctx_BMC, ctx_mask_BM)),
        )
    assert cache.length == 5
    torch.testing.assert_close(a, full_a[:, 2:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b, full[:, 3:], rtol=1e-5, atol=1e-5)


def test_uncached_calls_unchanged_and_names_the_same() -> None:
    dec = _decoder(True)
    names = set(dec.state_dict())
    assert "blocks.0.attn.q.weight" in names and "blocks.2.cross.k.weight" in names
    assert "norm.weight" in names and "blocks.1.norm_cross.bias" in names
    with pytest.raises(ValueError, match="ctx_BMC"):
        dec(torch.randn(1, 2, 16))


def test_cached_attention_matches_uncached_attention_bitwise_on_the_first_call() -> None:
    """A first cached call (nothing cached) runs exactly the uncached computation."""
    torch.manual_seed(0)
    attn = Attention(16, 4, causal=True).eval()
    x = torch.randn(2, 5, 16)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 3:] = False
    for m in (None, mask):
        assert torch.equal(attn(x, mask_BK=m, cache=KVCache()), attn(x, mask_BK=m))
    cross = Attention(16, 4, kv_width=8).eval()
    ctx = torch.randn(2, 3, 8)
    cache = KVCache(static=True)
    assert torch.equal(cross(x, ctx, cache=cache), cross(x, ctx))
    assert cache.length == 3
    assert torch.equal(cross(x, None, cache=cache), cross(x, ctx))
