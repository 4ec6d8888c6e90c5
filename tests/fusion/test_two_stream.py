"""Two-stream fusion (ViLBERT, LXMERT): shapes, padding, connectivity, co-attention maths.

Legend: B batch, L language tokens, R vision tokens, D model width, W/V stream widths,
H heads, E head width.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mmptm.config import ConfigError, from_dict
from mmptm.encoders.base import ModalityTokens, init_weights
from mmptm.fusion.two_stream import TwoStreamFusion
from mmptm.layers import Attention, TransformerBlock
from mmptm.registry import FUSIONS

D = 32
MODALITIES = ["text", "regions"]


def _fusion(variant: str, **over) -> TwoStreamFusion:
    """A tiny fusion: 2 language layers, 1 vision/object layer, 1 join, widths 16/24."""
    torch.manual_seed(0)
    sizes = (
        {"vision_layers": 1, "connections": [[1, 0]]}
        if variant == "vilbert"
        else {"object_layers": 1, "cross_layers": 1}
    )
    cfg = {
        "type": "two_stream",
        "variant": variant,
        "language_layers": 2,
        "language_width": 16,
        "vision_width": 24,
        "language_heads": 2,
        "vision_heads": 3,
        "language_mlp_ratio": 2.0,
        "vision_mlp_ratio": 1.0,
        **sizes,
        **over,
    }
    fusion = FUSIONS.build(from_dict(TwoStreamFusion.Config, cfg), width=D, modalities=MODALITIES)
    # Ten times BERT's init scale, so cross-modal effects stand far above float noise.
    init_weights(fusion, std=0.2)
    return fusion.eval()


def _tokens(g: torch.Generator) -> dict[str, ModalityTokens]:
    text_mask_BL = torch.ones(3, 5, dtype=torch.bool)
    text_mask_BL[1, 3:] = False
    region_mask_BR = torch.ones(3, 4, dtype=torch.bool)
    region_mask_BR[2, 2:] = False
    return {
        "text": ModalityTokens(torch.randn(3, 5, D, generator=g), text_mask_BL),
        "regions": ModalityTokens(torch.randn(3, 4, D, generator=g), region_mask_BR),
    }


def _pad(tokens: dict[str, ModalityTokens], m: str, extra: int, g: torch.Generator):
    """Append ``extra`` masked-out garbage positions to modality ``m``."""
    t = tokens[m]
    B = t.tokens.shape[0]
    garbage_BXD = 10 * torch.randn(B, extra, D, generator=g)
    padded = ModalityTokens(
        torch.cat([t.tokens, garbage_BXD], dim=1),
        torch.cat([t.mask, torch.zeros(B, extra, dtype=torch.bool)], dim=1),
    )
    return {**tokens, m: padded}


@pytest.mark.parametrize("variant", ["vilbert", "lxmert"])
@pytest.mark.parametrize("widths", [(0, 48), (16, 24)])
def test_shapes_at_model_width(variant: str, widths: tuple[int, int]) -> None:
    fusion = _fusion(variant, language_width=widths[0], vision_width=widths[1])
    tokens = _tokens(torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = fusion(tokens)
    assert out.hidden["text"].shape == (3, 5, D)
    assert out.hidden["regions"].shape == (3, 4, D)
    assert set(out.pooled) == {"text", "regions", "joint"}
    assert all(p.shape == (3, D) for p in out.pooled.values())
    assert out.mask["text"] is tokens["text"].mask
    assert out.mask["regions"] is tokens["regions"].mask


@pytest.mark.parametrize("variant", ["vilbert", "lxmert"])
@pytest.mark.parametrize("stream", ["text", "regions"])
@pytest.mark.parametrize("prenorm,pooling", [(False, "first"), (True, "mean")])
def test_padding_invariance(variant: str, stream: str, prenorm: bool, pooling: str) -> None:
    g = torch.Generator().manual_seed(1)
    fusion = _fusion(variant, prenorm=prenorm, vision_pooling=pooling)
    tokens = _tokens(g)
    padded = _pad(tokens, stream, extra=3, g=g)
    with torch.no_grad():
        a, b = fusion(tokens), fusion(padded)
    for m in MODALITIES:
        mask_BN = tokens[m].mask
        n = mask_BN.shape[1]
        torch.testing.assert_close(
            b.hidden[m][:, :n][mask_BN], a.hidden[m][mask_BN], atol=1e-5, rtol=1e-5
        )
    for k in a.pooled:
        torch.testing.assert_close(b.pooled[k], a.pooled[k], atol=1e-5, rtol=1e-5)


def _changed(fusion: TwoStreamFusion, source: str, target: str) -> float:
    """Largest change of ``target``'s outputs at real positions when ``source`` changes."""
    g = torch.Generator().manual_seed(2)
    tokens = _tokens(g)
    t = tokens[source]
    other = {**tokens, source: ModalityTokens(torch.randn(t.tokens.shape, generator=g), t.mask)}
    with torch.no_grad():
        a, b = fusion(tokens), fusion(other)
    mask_BN = tokens[target].mask
    hidden = (a.hidden[target][mask_BN] - b.hidden[target][mask_BN]).abs().max()
    pooled = (a.pooled[target] - b.pooled[target]).abs().max()
    return max(hidden.item(), pooled.item())


@pytest.mark.parametrize("variant", ["vilbert", "lxmert"])
@pytest.mark.parametrize("source,target", [("regions", "text"), ("text", "regions")])
def test_cross_modal_path_is_real(variant: str, source: str, target: str) -> None:
    assert _changed(_fusion(variant), source, target) > 1e-2


@pytest.mark.parametrize("connections", [[[0, 0]], [[2, 1]], [[1, 0], [2, 1]]])
def test_vilbert_connections_connect(connections: list[list[int]]) -> None:
    fusion = _fusion("vilbert", connections=connections)
    assert len(fusion.joins) == len(connections)
    assert _changed(fusion, "regions", "text") > 1e-2
    assert _changed(fusion, "text", "regions") > 1e-2


@pytest.mark.parametrize("source,target", [("regions", "text"), ("text", "regions")])
def test_vilbert_without_connections_keeps_streams_independent(source: str, target: str) -> None:
    fusion = _fusion("vilbert", connections=[])
    assert len(fusion.joins) == 0
    assert _changed(fusion, source, target) == 0.0


def _explicit_attention(
    attn: Attention, xq_BQD: torch.Tensor, xk_BKC: torch.Tensor, mask_BK: torch.Tensor
) -> torch.Tensor:
    """softmax(QKᵀ/√E)V per head with ``attn``'s weights, keys masked, then the out projection."""
    B, Q, D_ = xq_BQD.shape
    K, H = xk_BKC.shape[1], attn.heads
    E = D_ // H
    q_BHQE = (xq_BQD @ attn.q.weight.T + attn.q.bias).view(B, Q, H, E).transpose(1, 2)
    k_BHKE = (xk_BKC @ attn.k.weight.T + attn.k.bias).view(B, K, H, E).transpose(1, 2)
    v_BHKE = (xk_BKC @ attn.v.weight.T + attn.v.bias).view(B, K, H, E).transpose(1, 2)
    s_BHQK = q_BHQE @ k_BHKE.transpose(-1, -2) / math.sqrt(E)
    s_BHQK = s_BHQK.masked_fill(~mask_BK[:, None, None, :], float("-inf"))
    o_BQD = (s_BHQK.softmax(-1) @ v_BHKE).transpose(1, 2).reshape(B, Q, D_)
    return o_BQD @ attn.out.weight.T + attn.out.bias


def _explicit_mlp(mlp: torch.nn.Sequential, x_BND: torch.Tensor) -> torch.Tensor:
    return F.linear(F.gelu(F.linear(x_BND, mlp[0].weight, mlp[0].bias)), mlp[2].weight, mlp[2].bias)


def _explicit_ln(norm: torch.nn.LayerNorm, x_BND: torch.Tensor) -> torch.Tensor:
    mu_BN1 = x_BND.mean(-1, keepdim=True)
    var_BN1 = ((x_BND - mu_BN1) ** 2).mean(-1, keepdim=True)
    return (x_BND - mu_BN1) / torch.sqrt(var_BN1 + norm.eps) * norm.weight + norm.bias


@pytest.mark.parametrize(
    "variant,over",
    [
        ("vilbert", {}),
        ("lxmert", {}),
        ("lxmert", {"language_width": 0, "vision_width": 0, "vision_heads": 2}),  # shared
    ],
    ids=["vilbert", "lxmert", "lxmert-shared"],
)
@pytest.mark.parametrize("prenorm", [False, True])
def test_join_matches_explicit_computation(variant: str, over: dict, prenorm: bool) -> None:
    """co-TRM (cross → FFN) and LXMERT's cross-modality layer (cross → self → FFN), written
    out: both directions read the states from before the join (pre-LN: each stream's
    normalised states are its queries and the other stream's keys/values)."""
    fusion = _fusion(variant, prenorm=prenorm, **over)
    join = fusion.joins[0]
    W, V = join.lang.cross.q.in_features, join.vis.cross.q.in_features
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for m in join.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.5 * torch.randn(m.bias.shape, generator=g))
    l_BLW, v_BRV = torch.randn(2, 5, W, generator=g), torch.randn(2, 4, V, generator=g)
    l_mask_BL = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    v_mask_BR = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)

    def sublayer(norm, fn, x):
        if prenorm:
            return x + fn(_explicit_ln(norm, x))
        return _explicit_ln(norm, x + fn(x))

    def stream(block, x, mask, ctx, ctx_mask):
        x = sublayer(
            block.norm_cross, lambda h: _explicit_attention(block.cross, h, ctx, ctx_mask), x
        )
        if variant == "lxmert":
            x = sublayer(block.norm1, lambda h: _explicit_attention(block.attn, h, h, mask), x)
        return sublayer(block.norm2, lambda h: _explicit_mlp(block.mlp, h), x)

    with torch.no_grad():
        got_l, got_v = join(l_BLW, l_mask_BL, v_BRV, v_mask_BR)
        ctx_l = _explicit_ln(join.lang.norm_cross, l_BLW) if prenorm else l_BLW
        ctx_v = _explicit_ln(join.vis.norm_cross, v_BRV) if prenorm else v_BRV
        want_l = stream(join.lang, l_BLW, l_mask_BL, ctx_v, v_mask_BR)
        want_v = stream(join.vis, v_BRV, v_mask_BR, ctx_l, l_mask_BL)
    torch.testing.assert_close(got_l, want_l, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_v, want_v, atol=1e-5, rtol=1e-5)


def test_joins_are_transformer_blocks() -> None:
    """One attention/FFN implementation: the joins run the shared TransformerBlock."""
    for variant, order in [("vilbert", ("cross", "mlp")), ("lxmert", ("cross", "self", "mlp"))]:
        join = _fusion(variant).joins[0]
        for block in (join.lang, join.vis):
            assert type(block) is TransformerBlock
            assert block.sublayers == order
    vilbert = _fusion("vilbert").joins[0]
    assert vilbert.lang.attn is None and vilbert.vis.attn is None  # co-TRM: no self-attention


def test_lxmert_shares_cross_attention_only_at_equal_widths() -> None:
    shared = _fusion("lxmert", language_width=0, vision_width=0, vision_heads=2)
    for join in shared.joins:
        assert join.vis.cross is join.lang.cross
        assert join.vis.norm_cross is join.lang.norm_cross
    unshared = _fusion("lxmert")
    assert unshared.joins[0].vis.cross is not unshared.joins[0].lang.cross
    assert unshared.joins[0].vis.norm_cross is not unshared.joins[0].lang.norm_cross
    # Not shared at equal widths but different heads either.
    heads = _fusion("lxmert", language_width=0, vision_width=0, vision_heads=4)
    assert heads.joins[0].vis.cross is not heads.joins[0].lang.cross
    assert _changed(shared, "regions", "text") > 1e-2
    assert _changed(shared, "text", "regions") > 1e-2


def test_pooled_joint_per_variant() -> None:
    tokens = _tokens(torch.Generator().manual_seed(4))
    with torch.no_grad():
        vil, lx = _fusion("vilbert")(tokens), _fusion("lxmert")(tokens)
    torch.testing.assert_close(vil.pooled["joint"], vil.pooled["text"] * vil.pooled["regions"])
    torch.testing.assert_close(lx.pooled["joint"], lx.pooled["text"])


@pytest.mark.parametrize(
    "over,match",
    [
        ({"connections": [[1, 0], [3, 1]]}, r"\[3, 1\].*language_layers=2, vision_layers=1"),
        ({"connections": [[1, 2]]}, r"\[1, 2\].*language_layers=2, vision_layers=1"),
        ({"connections": [[2, 1], [1, 1]]}, r"\[1, 1\].*non-decreasing"),
        ({"connections": [[1]]}, r"\[1\]"),
        ({"object_layers": 3}, "object_layers does not apply to variant 'vilbert'"),
        ({"vision_width": -1}, "vision_width must be >= 0"),
    ],
)
def test_config_errors_name_the_problem(over: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _fusion("vilbert", **over)


def test_unknown_modalities_are_named() -> None:
    fusion = _fusion("lxmert")
    tokens = _tokens(torch.Generator().manual_seed(5))
    extra = {**tokens, "audio": tokens["text"]}
    with pytest.raises(ValueError, match=r"'audio'"):
        fusion(extra)
    with pytest.raises(ValueError, match=r"missing modalities \['regions'\]"):
        fusion({"text": tokens["text"]})
    cfg = from_dict(TwoStreamFusion.Config, {"variant": "lxmert", "vision": "image"})
    with pytest.raises(ValueError, match=r"no encoder for \['image'\]"):
        TwoStreamFusion(cfg, width=D, modalities=MODALITIES)
    with pytest.raises(ValueError, match=r"\['audio'\] unused"):
        TwoStreamFusion(cfg, width=D, modalities=["text", "image", "audio"])


@pytest.mark.parametrize(
    "variant,widths", [("vilbert", (0, 48)), ("lxmert", (0, 0)), ("lxmert", (16, 24))]
)
def test_backward_reaches_every_parameter(variant: str, widths: tuple[int, int]) -> None:
    fusion = _fusion(variant, language_width=widths[0], vision_width=widths[1], vision_heads=2)
    out = fusion(_tokens(torch.Generator().manual_seed(6)))
    total = sum(h.sum() for h in out.hidden.values()) + sum(p.sum() for p in out.pooled.values())
    total.backward()
    for name, p in fusion.named_parameters():
        assert p.grad is not None, name
        # Softmax ignores a shift shared by all keys, so key biases get (numerically) no grad.
        if not name.endswith("k.bias"):
            assert p.grad.abs().sum() > 0, name


def test_published_sizes_instantiate() -> None:
    """ViLBERT-base and LXMERT at their published sizes (built on the meta device: no memory)."""
    with torch.device("meta"):
        vilbert = TwoStreamFusion(
            from_dict(TwoStreamFusion.Config, {"vision_width": 1024, "vision_mlp_ratio": 1.0}),
            width=768,
        )
        lxmert = TwoStreamFusion(
            from_dict(TwoStreamFusion.Config, {"variant": "lxmert"}),
            width=768,
        )
    assert (len(vilbert.lang_layers), len(vilbert.vis_layers), len(vilbert.joins)) == (12, 6, 6)
    assert vilbert.cfg.co_connections() == [(6 + i, i) for i in range(6)]
    assert (len(lxmert.lang_layers), len(lxmert.vis_layers), len(lxmert.joins)) == (9, 5, 5)
    assert lxmert.joins[0].vis.cross is lxmert.joins[0].lang.cross
    n_vilbert = sum(p.numel() for p in vilbert.parameters())
    n_lxmert = sum(p.numel() for p in lxmert.parameters())
    # ViLBERT reports ~221M with BERT's ~24M embeddings; the fusion alone is ~205M here.
    assert 180e6 < n_vilbert < 230e6, n_vilbert
    assert 160e6 < n_lxmert < 200e6, n_lxmert
