"""Attention and TransformerStack: explicit softmax reference, masks, dropout, padding."""

from __future__ import annotations

import math

import pytest
import torch

from mmptm.layers import Attention, TransformerBlock, TransformerConfig, TransformerStack


def _reference_attention(
    attn: Attention,
    x_BQD: torch.Tensor,
    kv_BKC: torch.Tensor,
    mask_BK: torch.Tensor | None,
    probs: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """softmax(QKᵀ/√E + mask)V with explicit loops over batch and heads, in float64.

    ``probs``, if given, receives each (batch, head)'s [Q,K] probabilities in that order.
    """
    W = {name: getattr(attn, name) for name in ("q", "k", "v", "out")}
    w = {n: m.weight.detach().double() for n, m in W.items()}
    b = {n: m.bias.detach().double() for n, m in W.items()}
    x = x_BQD.double()
    kv = kv_BKC.double()
    B, Q, D = x.shape
    K = kv.shape[1]
    H = attn.heads
    E = D // H
    out = torch.zeros(B, Q, D, dtype=torch.float64)
    for bi in range(B):
        q = x[bi] @ w["q"].T + b["q"]  # [Q,D]
        k = kv[bi] @ w["k"].T + b["k"]  # [K,D]
        v = kv[bi] @ w["v"].T + b["v"]  # [K,D]
        heads = []
        for h in range(H):
            sl = slice(h * E, (h + 1) * E)
            scores = q[:, sl] @ k[:, sl].T / math.sqrt(E)  # [Q,K]
            if mask_BK is not None:
                for j in range(K):
                    if not bool(mask_BK[bi, j]):
                        scores[:, j] = -math.inf
            scores = scores - scores.max(dim=1, keepdim=True).values
            p = scores.exp()
            p = p / p.sum(dim=1, keepdim=True)
            if probs is not None:
                probs.append(p)
            heads.append(p @ v[:, sl])
        out[bi] = torch.cat(heads, dim=1) @ w["out"].T + b["out"]
    return out


def _random_mask(B: int, K: int, g: torch.Generator) -> torch.Tensor:
    mask = torch.rand(B, K, generator=g) < 0.6
    mask[:, 0] = True  # at least one real key per row
    return mask


@pytest.mark.parametrize("use_mask", [False, True])
def test_self_attention_matches_explicit_softmax(use_mask: bool) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    attn = Attention(width=16, heads=4).eval()
    x = torch.randn(3, 7, 16, generator=g)
    mask = _random_mask(3, 7, g) if use_mask else None
    assert mask is None or not bool(mask.all())
    got = attn(x, mask_BK=mask)
    want = _reference_attention(attn, x, x, mask)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_cross_attention_with_other_kv_width_matches_explicit_softmax() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    attn = Attention(width=12, heads=3, kv_width=20).eval()
    assert attn.k.in_features == 20 and attn.v.in_features == 20
    x = torch.randn(2, 5, 12, generator=g)
    ctx = torch.randn(2, 9, 20, generator=g)
    mask = _random_mask(2, 9, g)
    got = attn(x, ctx, mask)
    assert got.shape == (2, 5, 12)
    want = _reference_attention(attn, x, ctx, mask)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_weights_match_explicit_softmax_and_ignore_masked_keys() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    attn = Attention(width=12, heads=3, kv_width=20, dropout=0.5).train()  # weights: no dropout
    x = torch.randn(2, 5, 12, generator=g)
    ctx = torch.randn(2, 9, 20, generator=g)
    mask = _random_mask(2, 9, g)
    probs: list[torch.Tensor] = []
    _reference_attention(attn, x, ctx, mask, probs)
    got = attn.weights(x, ctx, mask)
    assert got.shape == (2, 3, 5, 9)
    torch.testing.assert_close(
        got.double(), torch.stack(probs).view(2, 3, 5, 9), rtol=1e-5, atol=1e-6
    )
    assert bool((got[~mask[:, None, None, :].expand_as(got)] == 0).all())
    torch.testing.assert_close(got.sum(-1), torch.ones(2, 3, 5))


def test_masked_key_values_do_not_change_outputs() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    attn = Attention(width=16, heads=2).eval()
    x = torch.randn(2, 6, 16, generator=g)
    ctx = torch.randn(2, 8, 16, generator=g)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, 5:] = False
    mask[1, 2:4] = False
    garbage = ctx.clone()
    garbage[~mask] = 1e3 * torch.randn(int((~mask).sum()), 16, generator=g)
    with torch.no_grad():
        a = attn(x, ctx, mask)
        b = attn(x, garbage, mask)
        unmasked = attn(x, garbage, None)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # the garbage does matter when the mask is not given: the mask is what hides it
    assert not torch.allclose(a, unmasked, atol=1e-3)


def test_width_not_divisible_by_heads_raises() -> None:
    with pytest.raises(ValueError, match="not divisible"):
        Attention(width=10, heads=4)


def test_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    attn = Attention(width=16, heads=2, dropout=0.5)
    x = torch.randn(2, 10, 16)
    attn.eval()
    with torch.no_grad():
        e1, e2 = attn(x), attn(x)
    torch.testing.assert_close(e1, e2, rtol=0, atol=0)
    attn.train()
    with torch.no_grad():
        t1 = attn(x)
    assert not torch.allclose(t1, e1, atol=1e-4)


def _ln(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()


def _mlp(x: torch.Tensor, mlp: torch.nn.Sequential) -> torch.Tensor:
    h = x @ mlp[0].weight.double().T + mlp[0].bias.double()
    h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))  # exact GELU
    return h @ mlp[2].weight.double().T + mlp[2].bias.double()


_NORM = {"self": "norm1", "cross": "norm_cross", "mlp": "norm2"}


@pytest.mark.parametrize(
    "sublayers",
    [None, ("cross", "mlp"), ("cross", "self", "mlp"), ("mlp", "cross", "self")],
    ids=lambda s: "default" if s is None else "-".join(s),
)
@pytest.mark.parametrize("prenorm", [True, False])
def test_transformer_block_layout_matches_reference(
    prenorm: bool, sublayers: tuple[str, ...] | None
) -> None:
    """Pre-LN: x + f(LN(x)); post-LN (BERT): LN(x + f(x)); sublayers in the order named
    (default self → cross → MLP), against an explicit float64 composition."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(6)
    cfg = TransformerConfig(heads=2, mlp_ratio=2.0, prenorm=prenorm, layer_norm_eps=1e-5)
    block = TransformerBlock(8, cfg, cross_width=12, sublayers=sublayers).eval()
    order = sublayers or ("self", "cross", "mlp")
    assert block.sublayers == order
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for name in order:
            norm = getattr(block, _NORM[name])
            norm.weight.normal_()
            norm.bias.normal_()
    x = torch.randn(2, 5, 8, generator=g)
    mask = _random_mask(2, 5, g)
    ctx = torch.randn(2, 3, 12, generator=g)
    ctx_mask = torch.tensor([[True, True, False], [True, False, False]])
    with torch.no_grad():
        got = block(x, mask, ctx, ctx_mask)

    fns = {
        "self": lambda h: _reference_attention(block.attn, h, h, mask),
        "cross": lambda h: _reference_attention(block.cross, h, ctx, ctx_mask),
        "mlp": lambda h: _mlp(h, block.mlp),
    }
    with torch.no_grad():
        h = x.double()
        for name in order:
            norm, fn = getattr(block, _NORM[name]), fns[name]
            h = h + fn(_ln(h, norm)) if prenorm else _ln(h + fn(h), norm)
    torch.testing.assert_close(got.double(), h, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="ctx_BMC"):
        block(x, mask)


def test_transformer_block_builds_only_its_sublayers() -> None:
    cfg = TransformerConfig(heads=2)
    plain = TransformerBlock(8, cfg)
    assert plain.sublayers == ("self", "mlp") and plain.cross is None
    # Existing callers keep their parameter names (checkpoints, hf_import).
    assert {k.split(".")[0] for k in plain.state_dict()} == {"attn", "norm1", "mlp", "norm2"}
    co = TransformerBlock(8, cfg, cross_width=12, sublayers=("cross", "mlp"))
    assert co.attn is None and not hasattr(co, "norm1")
    assert {k.split(".")[0] for k in co.state_dict()} == {"cross", "norm_cross", "mlp", "norm2"}
    assert co.cross.k.in_features == 12


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"sublayers": ("self", "ffn")}, "at most once"),
        ({"sublayers": ("self", "self", "mlp")}, "at most once"),
        ({"sublayers": ()}, "at most once"),
        ({"sublayers": ("cross", "mlp")}, "needs cross_width"),
        ({"cross_width": 12, "sublayers": ("self", "mlp")}, "needs cross_width"),
    ],
)
def test_transformer_block_rejects_bad_sublayers(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TransformerBlock(8, TransformerConfig(heads=2), **kwargs)


def _padded_copy(x: torch.Tensor, mask: torch.Tensor, extra: int, g: torch.Generator):
    """Append ``extra`` garbage positions (mask False) to every row."""
    B, _, D = x.shape
    garbage = 10 * torch.randn(B, extra, D, generator=g)
    x2 = torch.cat([x, garbage], dim=1)
    m2 = torch.cat([mask, torch.zeros(B, extra, dtype=torch.bool)], dim=1)
    return x2, m2


@pytest.mark.parametrize("prenorm", [True, False])
def test_transformer_stack_padding_invariance(prenorm: bool) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(4)
    cfg = TransformerConfig(layers=2, heads=2, mlp_ratio=2.0, prenorm=prenorm, dropout=0.1)
    stack = TransformerStack(16, cfg).eval()
    assert isinstance(stack.norm, torch.nn.LayerNorm) == prenorm
    x = torch.randn(3, 6, 16, generator=g)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:] = False  # a row that is already padded
    x[1, 4:] = 5 * torch.randn(2, 16, generator=g)
    x2, m2 = _padded_copy(x, mask, extra=5, g=g)
    with torch.no_grad():
        y = stack(x, mask)
        y2 = stack(x2, m2)
    real = mask
    assert y2.shape == (3, 11, 16)
    torch.testing.assert_close(y2[:, :6][real], y[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("prenorm", [True, False])
def test_transformer_stack_mask_matters(prenorm: bool) -> None:
    """Guard against a stack that silently drops the mask: unmasked garbage changes outputs."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    stack = TransformerStack(16, TransformerConfig(layers=1, heads=2, prenorm=prenorm)).eval()
    x = torch.randn(2, 4, 16, generator=g)
    mask = torch.ones(2, 4, dtype=torch.bool)
    x2, m2 = _padded_copy(x, mask, extra=3, g=g)
    with torch.no_grad():
        y = stack(x, mask)
        y_nomask = stack(x2, torch.ones_like(m2))
    assert not torch.allclose(y_nomask[:, :4], y, atol=1e-3)


@pytest.mark.parametrize("use_mask", [False, True])
def test_causal_self_attention_matches_explicit_softmax_per_prefix(use_mask: bool) -> None:
    """Query i of a causal layer is plain attention of token i over tokens 0..i."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    attn = Attention(width=16, heads=4, causal=True).eval()
    x = torch.randn(3, 6, 16, generator=g)
    mask = torch.ones(3, 6, dtype=torch.bool)
    if use_mask:  # right padding, as the text plug-in collates
        mask[1, 4:] = False
        mask[2, 2:] = False
    got = attn(x, mask_BK=mask if use_mask else None)
    want = torch.cat(
        [
            _reference_attention(attn, x[:, i : i + 1], x[:, : i + 1], mask[:, : i + 1])
            for i in range(6)
        ],
        dim=1,
    )
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    weights = attn.weights(x, mask_BK=mask)
    assert bool((weights.triu(1) == 0).all())  # nothing above the diagonal
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 6))


def test_causal_attention_is_self_attention_only() -> None:
    with pytest.raises(ValueError, match="self-attention"):
        Attention(width=8, heads=2, kv_width=4, causal=True)
    attn = Attention(width=8, heads=2, causal=True)
    with pytest.raises(ValueError, match="self-attention"):
        attn(torch.randn(1, 3, 8), torch.randn(1, 3, 8))


def test_causal_stack_outputs_do_not_see_later_tokens() -> None:
    torch.manual_seed(0)
    cfg = TransformerConfig(layers=2, heads=2, causal=True, activation="quick_gelu")
    stack = TransformerStack(8, cfg).eval()
    x = torch.randn(2, 7, 8)
    changed = x.clone()
    changed[:, 4:] = torch.randn(2, 3, 8)
    with torch.no_grad():
        a, b = stack(x), stack(changed)
    torch.testing.assert_close(a[:, :4], b[:, :4], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 4:], b[:, 4:], atol=1e-3)


def test_quick_gelu_activation_in_the_mlp() -> None:
    block = TransformerBlock(8, TransformerConfig(heads=2, activation="quick_gelu")).eval()
    h = torch.linspace(-4, 4, 17)
    torch.testing.assert_close(block.mlp[1](h), h / (1 + torch.exp(-1.702 * h)))
    with pytest.raises(ValueError, match="activation 'swish' is unknown"):
        TransformerBlock(8, TransformerConfig(heads=2, activation="swish"))
