"""ERNIE's knowledge fusion: the fusion formula by hand, the entity attention's masking, the
without-graph switch, padding."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mmptm.config import from_dict
from mmptm.encoders.base import ModalityTokens
from mmptm.fusion.ernie import ErnieFusion, KnowledgeLayer
from mmptm.layers import TransformerConfig


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _layer(prenorm: bool = False, entity_output: bool = True, seed: int = 0) -> KnowledgeLayer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(heads=2, mlp_ratio=2.0, dropout=0.0, attn_dropout=0.0, prenorm=prenorm)
    layer = KnowledgeLayer(8, 4, 2, cfg, entity_output=entity_output)
    for p in layer.parameters():  # away from LayerNorm's ones/zeros so every weight matters
        torch.nn.init.normal_(p, std=0.5)
    return layer.eval()


def test_fusion_formula_by_hand():
    layer = _layer()
    g = torch.Generator().manual_seed(1)
    w = torch.randn(2, 5, 8, generator=g)
    e = torch.randn(2, 5, 4, generator=g)
    has = torch.tensor([[False, True, False, False, True], [False] * 5])
    h = layer.fuse(w, e, has)
    Wt, b, We = layer.w_t.weight, layer.w_t.bias, layer.w_e.weight
    for i in range(2):
        for j in range(5):
            pre = Wt @ w[i, j] + b  # tokens without an entity: GELU(W_t w + b)
            if has[i, j]:
                pre = pre + We @ e[i, j]
            torch.testing.assert_close(h[i, j], _gelu(pre))


def _attend(attn, x_QD: torch.Tensor) -> torch.Tensor:
    """Plain multi-head self-attention over all of ``x`` (no mask), in float64."""
    H = attn.heads
    q, k, v = (F.linear(x_QD.double(), m.weight.double(), m.bias.double())
               for m in (attn.q, attn.k, attn.v))  # fmt: skip
    E = q.shape[-1] // H
    heads = []
    for h in range(H):
        s = slice(h * E, (h + 1) * E)
        p = (q[:, s] @ k[:, s].T / math.sqrt(E)).softmax(-1)
        heads.append(p @ v[:, s])
    return F.linear(torch.cat(heads, -1), attn.out.weight.double(), attn.out.bias.double())


def _ln(norm, x):
    return F.layer_norm(x, x.shape[-1:], norm.weight.double(), norm.bias.double(), norm.eps)


def test_knowledge_layer_against_hand_computation():
    """Post-LN layer, one sample: token attention over the real tokens, entity attention
    over the entity positions alone (run on that subsequence), fusion, split."""
    layer = _layer()
    g = torch.Generator().manual_seed(2)
    w = torch.randn(1, 6, 8, generator=g)
    e = torch.randn(1, 6, 4, generator=g)
    mask = torch.tensor([[True] * 5 + [False]])
    has = torch.tensor([[False, True, False, True, False, False]])
    e = e * has[..., None]
    w_out, e_out = layer(w, e, mask, has)

    real, ent = [0, 1, 2, 3, 4], [1, 3]
    w_att = _ln(layer.norm1, w[0, real].double() + _attend(layer.attn, w[0, real]))
    e_att = _ln(layer.entity_norm1, e[0, ent].double() + _attend(layer.entity_attn, e[0, ent]))
    pre = F.linear(w_att, layer.w_t.weight.double(), layer.w_t.bias.double())
    pre[[1, 3]] += e_att @ layer.w_e.weight.double().T
    h = _gelu(pre)
    w_new = _ln(
        layer.norm2, w_att + F.linear(h, layer.out.weight.double(), layer.out.bias.double())
    )
    e_new = _ln(
        layer.entity_norm2,
        e_att
        + F.linear(h[[1, 3]], layer.entity_out.weight.double(), layer.entity_out.bias.double()),
    )
    torch.testing.assert_close(w_out[0, real].double(), w_new, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e_out[0, ent].double(), e_new, atol=1e-5, rtol=1e-5)
    assert (e_out[0, [0, 2, 4, 5]] == 0).all()  # entity states only where an entity is


def _fusion(**over) -> ErnieFusion:
    tree = {
        "type": "ernie",
        "transformer": {"layers": 1, "heads": 2, "dropout": 0.0, "attn_dropout": 0.0},
        "knowledge_layers": 2, "entity_dim": 4, "entity_heads": 2,
        "entities": {"num_entities": 7, "dim": 4}, "entity_views": {}, **over,
    }  # fmt: skip
    torch.manual_seed(0)
    return ErnieFusion(from_dict(ErnieFusion.Config, tree), width=8).eval()


def test_entities_change_the_output_and_the_switch_ignores_them():
    on, off = _fusion(), _fusion(knowledge=False)
    off.load_state_dict(on.state_dict())
    on.entity_keys = off.entity_keys = {"text": ("text", "entity_ids")}
    g = torch.Generator().manual_seed(3)
    tokens = {"text": ModalityTokens(torch.randn(2, 5, 8, generator=g), torch.ones(2, 5).bool())}
    ids = torch.tensor([[-1, 2, -1, 5, -1], [-1, -1, -1, -1, -1]])
    none = torch.full_like(ids, -1)
    with_ent = on(tokens, {"entity_ids": ids}).hidden["text"]
    without = on(tokens, {"entity_ids": none}).hidden["text"]
    assert not torch.allclose(with_ent[0], without[0])  # the entities matter
    torch.testing.assert_close(with_ent[1], without[1])  # a sample without any: unchanged
    torch.testing.assert_close(off(tokens, {"entity_ids": ids}).hidden["text"], without)


def test_padding_does_not_change_real_tokens():
    f = _fusion()
    f.entity_keys = {"text": ("text", "entity_ids")}
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, 4, 8, generator=g)
    ids = torch.tensor([[-1, 3, -1, 6]])
    short = f({"text": ModalityTokens(x, torch.ones(1, 4).bool())}, {"entity_ids": ids})
    padded_x = torch.cat([x, torch.randn(1, 3, 8, generator=g)], 1)
    padded_ids = torch.cat([ids, torch.tensor([[4, -1, 2]])], 1)  # ids on padding: ignored
    mask = torch.tensor([[True] * 4 + [False] * 3])
    long = f({"text": ModalityTokens(padded_x, mask)}, {"entity_ids": padded_ids})
    torch.testing.assert_close(
        long.hidden["text"][:, :4], short.hidden["text"], atol=1e-5, rtol=1e-5
    )
