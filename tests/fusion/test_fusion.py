"""Fusion modules: padding invariance, splitting, pooling, per-modality towers."""

from __future__ import annotations

import pytest
import torch

from mmptm.config import from_dict
from mmptm.encoders.base import ModalityTokens
from mmptm.fusion.base import pool
from mmptm.fusion.dual import DualFusion
from mmptm.fusion.single_stream import SingleStreamFusion

D = 16


def _tokens(g: torch.Generator) -> dict[str, ModalityTokens]:
    text_mask = torch.ones(3, 5, dtype=torch.bool)
    text_mask[1, 3:] = False
    text_mask[2, 4:] = False
    text = torch.randn(3, 5, D, generator=g)
    image = torch.randn(3, 4, D, generator=g)
    return {
        "text": ModalityTokens(text, text_mask),
        "image": ModalityTokens(image, torch.ones(3, 4, dtype=torch.bool)),
    }


def _pad_text(tokens: dict[str, ModalityTokens], extra: int, g: torch.Generator):
    t = tokens["text"]
    B = t.tokens.shape[0]
    garbage = 10 * torch.randn(B, extra, D, generator=g)
    padded = ModalityTokens(
        torch.cat([t.tokens, garbage], dim=1),
        torch.cat([t.mask, torch.zeros(B, extra, dtype=torch.bool)], dim=1),
    )
    return {**tokens, "text": padded}


def _single_stream(prenorm: bool = True, pooling: str = "mean") -> SingleStreamFusion:
    torch.manual_seed(0)
    cfg = from_dict(
        SingleStreamFusion.Config,
        {
            "type": "single_stream",
            "transformer": {"layers": 2, "heads": 2, "mlp_ratio": 2.0, "prenorm": prenorm},
            "modality_pooling": pooling,
        },
    )
    return SingleStreamFusion(cfg, width=D).eval()


@pytest.mark.parametrize("prenorm", [True, False])
def test_single_stream_text_padding_invariance(prenorm: bool) -> None:
    g = torch.Generator().manual_seed(0)
    fusion = _single_stream(prenorm)
    tokens = _tokens(g)
    padded = _pad_text(tokens, extra=4, g=g)
    with torch.no_grad():
        a = fusion(tokens)
        b = fusion(padded)
    real = tokens["text"].mask
    assert b.hidden["text"].shape == (3, 9, D)
    assert b.hidden["image"].shape == (3, 4, D)
    tight = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(b.hidden["text"][:, :5][real], a.hidden["text"][real], **tight)
    torch.testing.assert_close(b.hidden["image"], a.hidden["image"], **tight)
    for key in ("joint", "text", "image"):
        torch.testing.assert_close(b.pooled[key], a.pooled[key], **tight)
    assert torch.equal(b.mask["text"], padded["text"].mask)


def test_single_stream_outputs_are_the_split_joint_sequence() -> None:
    g = torch.Generator().manual_seed(1)
    fusion = _single_stream(pooling="mean")
    tokens = _tokens(g)
    with torch.no_grad():
        out = fusion(tokens)
        x = torch.cat([tokens["text"].tokens, tokens["image"].tokens], dim=1)
        m = torch.cat([tokens["text"].mask, tokens["image"].mask], dim=1)
        joint = fusion.stack(x, m)
    torch.testing.assert_close(out.hidden["text"], joint[:, :5], rtol=0, atol=0)
    torch.testing.assert_close(out.hidden["image"], joint[:, 5:], rtol=0, atol=0)
    # pooled["joint"]: the BERT pooler tanh(W·h_first + b), computed by hand
    W, bias = fusion.pooler[0].weight, fusion.pooler[0].bias
    torch.testing.assert_close(out.pooled["joint"], torch.tanh(joint[:, 0] @ W.T + bias))
    # pooled[text]: mean over real tokens only, by explicit loop
    for b in range(3):
        n = int(tokens["text"].mask[b].sum())
        want = sum(joint[b, i] for i in range(n)) / n
        torch.testing.assert_close(out.pooled["text"][b], want)


def test_single_stream_without_pooler_uses_first_token() -> None:
    torch.manual_seed(0)
    cfg = SingleStreamFusion.Config(pooler=False, modality_pooling="first")
    cfg.transformer.heads = 2
    fusion = SingleStreamFusion(cfg, width=D).eval()
    with torch.no_grad():
        out = fusion(_tokens(torch.Generator().manual_seed(2)))
    torch.testing.assert_close(out.pooled["joint"], out.hidden["text"][:, 0], rtol=0, atol=0)
    torch.testing.assert_close(out.pooled["image"], out.hidden["image"][:, 0], rtol=0, atol=0)


def _dual(pooling: str, prenorm: bool = True, transformer_extra=None, **extra) -> DualFusion:
    torch.manual_seed(0)
    transformer = {"layers": 2, "heads": 2, "mlp_ratio": 2.0, "prenorm": prenorm}
    cfg = from_dict(
        DualFusion.Config,
        {
            "type": "dual",
            "transformer": {**transformer, **(transformer_extra or {})},
            "pooling": {"text": pooling},
            **extra,
        },
    )
    return DualFusion(cfg, width=D, modalities=["image", "text"]).eval()


@pytest.mark.parametrize("prenorm", [True, False])
@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_dual_text_tower_padding_invariance(pooling: str, prenorm: bool) -> None:
    g = torch.Generator().manual_seed(3)
    fusion = _dual(pooling, prenorm)
    tokens = _tokens(g)
    padded = _pad_text(tokens, extra=3, g=g)
    with torch.no_grad():
        a = fusion(tokens)
        b = fusion(padded)
    real = tokens["text"].mask
    tight = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(b.hidden["text"][:, :5][real], a.hidden["text"][real], **tight)
    torch.testing.assert_close(b.pooled["text"], a.pooled["text"], **tight)
    torch.testing.assert_close(b.pooled["image"], a.pooled["image"], **tight)
    assert "joint" not in a.pooled
    # the image has no pooling entry: the default is the masked mean
    torch.testing.assert_close(a.pooled["image"], a.hidden["image"].mean(1))
    h = a.hidden["text"]
    if pooling == "first":
        torch.testing.assert_close(a.pooled["text"], h[:, 0], rtol=0, atol=0)
    else:
        want = torch.stack([h[i][real[i]].mean(0) for i in range(3)])
        torch.testing.assert_close(a.pooled["text"], want)


def test_dual_towers_are_independent_and_zero_layers_pass_through() -> None:
    g = torch.Generator().manual_seed(4)
    fusion = _dual("mean", layers={"image": 0})
    assert len(fusion.towers["image"].blocks) == 0
    assert len(fusion.towers["text"].blocks) == 2
    tokens = _tokens(g)
    other_text = {**tokens, "text": ModalityTokens(torch.randn(3, 5, D), tokens["text"].mask)}
    with torch.no_grad():
        a = fusion(tokens)
        b = fusion(other_text)
    torch.testing.assert_close(a.hidden["image"], tokens["image"].tokens, rtol=0, atol=0)
    torch.testing.assert_close(b.hidden["image"], a.hidden["image"], rtol=0, atol=0)
    assert not torch.allclose(a.hidden["text"], b.hidden["text"])


def test_dual_rejects_unknown_modalities() -> None:
    cfg = DualFusion.Config(layers={"audio": 1})
    with pytest.raises(ValueError, match="audio"):
        DualFusion(cfg, width=D, modalities=["image", "text"])
    cfg = DualFusion.Config(pooling={"video": "first"})
    with pytest.raises(ValueError, match="video"):
        DualFusion(cfg, width=D, modalities=["image", "text"])


def test_pool_mean_ignores_padding_and_rejects_unknown() -> None:
    x = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, -100.0]]])
    mask = torch.tensor([[True, True, False]])
    torch.testing.assert_close(pool(x, mask, "mean"), torch.tensor([[2.0, 3.0]]))
    torch.testing.assert_close(pool(x, mask, "first"), torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="max"):
        pool(x, mask, "max")


def test_pool_last_takes_each_rows_last_real_token() -> None:
    x = torch.arange(2 * 4 * 2, dtype=torch.float).view(2, 4, 2)
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    torch.testing.assert_close(pool(x, mask, "last"), torch.stack([x[0, 2], x[1, 3]]))


def test_dual_causal_text_tower_pooled_at_last_token_ignores_padding() -> None:
    """A causal tower pooled at the last real token: what open_clip's text tower does at its
    end token. Padding after it changes nothing, and the result is the tower's output for
    the sequence cut at that token."""
    g = torch.Generator().manual_seed(5)
    fusion = _dual("last", transformer_extra={"causal": True})
    tokens = _tokens(g)
    padded = _pad_text(tokens, extra=3, g=g)
    with torch.no_grad():
        a, b = fusion(tokens), fusion(padded)
        torch.testing.assert_close(b.pooled["text"], a.pooled["text"], rtol=1e-5, atol=1e-5)
        t = tokens["text"]
        for i, n in enumerate(t.mask.sum(1).tolist()):
            alone = fusion.towers["text"](t.tokens[i : i + 1, :n])[0, -1]
            torch.testing.assert_close(a.pooled["text"][i], alone, rtol=1e-5, atol=1e-5)


def test_dual_towers_at_their_own_widths() -> None:
    cfg = DualFusion.Config(layers={"image": 1})
    fusion = DualFusion(cfg, width=D, modalities=["image", "text"], widths={"image": 24})
    assert fusion.towers["image"].norm.normalized_shape == (24,)
    assert fusion.towers["text"].norm.normalized_shape == (D,)
    out = fusion(
        {
            "text": ModalityTokens(torch.randn(2, 3, D), torch.ones(2, 3, dtype=torch.bool)),
            "image": ModalityTokens(torch.randn(2, 5, 24), torch.ones(2, 5, dtype=torch.bool)),
        }
    )
    assert out.pooled["image"].shape == (2, 24) and out.pooled["text"].shape == (2, D)
    tied = DualFusion.Config(tie_towers={"image": "text"})
    with pytest.raises(ValueError, match="widths differ"):
        DualFusion(tied, width=D, modalities=["image", "text"], widths={"image": 24})
    with pytest.raises(ValueError, match="pooling .*choices"):
        DualFusion(DualFusion.Config(pooling={"text": "max"}), width=D, modalities=["text"])
