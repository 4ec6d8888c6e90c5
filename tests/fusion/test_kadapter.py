"""K-Adapter fusion: the base is single_stream's (same names, same outputs), adapters read the
states they name (checked against truncated single-stream stacks), the base stays frozen."""

from __future__ import annotations

import pytest
import torch

from mmptm.config import from_dict
from mmptm.encoders.base import ModalityTokens
from mmptm.fusion.kadapter import AdapterConfig, KAdapterFusion
from mmptm.fusion.single_stream import SingleStreamFusion
from mmptm.layers import TransformerConfig

D = 32
BASE = TransformerConfig(layers=3, heads=4, dropout=0.0, attn_dropout=0.0, prenorm=False)


def _fusion(**adapters: list[int]) -> KAdapterFusion:
    cfg = KAdapterFusion.Config(
        transformer=BASE,
        adapters={
            n: AdapterConfig(layers=at, width=16, depth=1, heads=2) for n, at in adapters.items()
        },
    )
    return KAdapterFusion(cfg, width=D, modalities=["text"]).eval()


def _tokens(seed: int = 0) -> dict[str, ModalityTokens]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 7, D, generator=g)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False
    return {"text": ModalityTokens(x, mask)}


def _single(layers: int, like: KAdapterFusion) -> SingleStreamFusion:
    """A single-stream fusion with ``like``'s first ``layers`` base layers."""
    cfg = SingleStreamFusion.Config(
        transformer=TransformerConfig(**{**BASE.__dict__, "layers": layers})
    )
    s = SingleStreamFusion(cfg, width=D, modalities=["text"]).eval()
    missing, _ = s.load_state_dict(like.state_dict(), strict=False)
    assert not missing
    return s


def test_adapters_read_the_base_states_they_name() -> None:
    f = _fusion(facts=[0, 2], cloze=[3])
    tok = _tokens()
    with torch.no_grad():
        for a in f.adapters.values():  # an adapter with up = 0 passes its input through
            for layer in a.layers:
                layer.up.weight.zero_()
                layer.up.bias.zero_()
        eye = torch.eye(D)
        picks = {"base": 0, "facts": 1, "cloze": 2}
        out = {}
        for name, k in picks.items():  # combine = select one of the concatenated streams
            f.combine.weight.zero_()
            f.combine.bias.zero_()
            f.combine.weight[:, k * D : (k + 1) * D] = eye
            out[name] = f(tok).hidden["text"]
        s0 = tok["text"].tokens
        s2 = _single(2, f)(tok).hidden["text"]
        s3 = _single(3, f)(tok).hidden["text"]
    torch.testing.assert_close(out["base"], s3)  # the base is single_stream, same weights
    torch.testing.assert_close(out["facts"], s0 + s2)  # h1 = s0; h2 = s2 + h1
    torch.testing.assert_close(out["cloze"], s3)


def test_the_base_is_frozen_and_the_adapters_learn() -> None:
    torch.manual_seed(0)
    f = _fusion(facts=[0, 1]).train()
    assert not any(
        p.requires_grad for n, p in f.named_parameters() if n.startswith(("stack.", "pooler."))
    )
    before = {k: v.clone() for k, v in f.state_dict().items()}
    opt = torch.optim.AdamW(
        [p for p in f.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1
    )
    tok, target = _tokens(1), torch.randn(3, 7, D)
    losses = []
    for _ in range(30):
        loss = (f(tok).hidden["text"] - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    after = f.state_dict()
    for k in before:
        same = torch.equal(before[k], after[k])
        assert same == k.startswith(("stack.", "pooler.")), k
    assert losses[-1] < 0.5 * losses[0]


def test_kadapter_config_errors() -> None:
    with pytest.raises(ValueError, match="at least one adapter"):
        KAdapterFusion(KAdapterFusion.Config(transformer=BASE), width=D)
    with pytest.raises(ValueError, match=r"adapters.facts.layers.*0..3"):
        _fusion(facts=[0, 4])
    with pytest.raises(ValueError, match="increasing"):
        _fusion(facts=[2, 1])
    cfg = from_dict(KAdapterFusion.Config, {"adapters": {"facts": {"layers": [0, 1], "width": 8}}})
    assert cfg.adapters["facts"] == AdapterConfig(layers=[0, 1], width=8)


def test_a_base_of_another_depth_is_an_error_not_fresh_weights() -> None:
    f = _fusion(facts=[0])
    deeper = SingleStreamFusion(
        SingleStreamFusion.Config(transformer=TransformerConfig(**{**BASE.__dict__, "layers": 4})),
        width=D,
    )
    with pytest.raises(ValueError, match="base has 64 stack tensors, this fusion 48"):
        f.load_state_dict(deeper.state_dict(), strict=False)
    with pytest.raises(ValueError, match="model.fusion.transformer"):
        f.load_state_dict(_single(2, f).state_dict(), strict=False)
    f.load_state_dict(_single(3, f).state_dict(), strict=False)  # the same shape loads


def test_published_adapter_size() -> None:
    """K-Adapter on RoBERTa-large: adapters at layers 0, 11, 22, each layer down 1024 → 768,
    two post-LN Transformer layers 768 wide (3072 MLP), up 768 → 1024: counted by hand."""
    large = TransformerConfig(layers=24, heads=16, prenorm=False)
    cfg = KAdapterFusion.Config(
        transformer=large, pooler=False,
        adapters={"facts": AdapterConfig(layers=[0, 11, 22], width=768, depth=2, heads=12)},
    )  # fmt: skip
    with torch.device("meta"):
        f = KAdapterFusion(cfg, width=1024)
    block = 4 * (768 * 768 + 768) + (768 * 3072 + 3072) + (3072 * 768 + 768) + 2 * 2 * 768
    layer = (1024 * 768 + 768) + 2 * block + (768 * 1024 + 1024)
    assert sum(p.numel() for p in f.adapters.parameters()) == 3 * layer  # 47.3M
    assert sum(p.numel() for p in f.combine.parameters()) == 2048 * 1024 + 1024
    base = sum(p.numel() for p in f.stack.parameters())
    assert 300e6 < base < 305e6  # RoBERTa-large's 24 layers: 302M
