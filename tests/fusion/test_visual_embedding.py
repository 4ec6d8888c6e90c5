"""The visual-embedding fusion (VL-BERT, B2T2): the text tokens get a projection of the whole
image before the stack, checked against ``single_stream`` on embeddings summed by hand.

Legend: B batch, L text tokens, N visual tokens, D width.
"""

from __future__ import annotations

import pytest
import torch

from mmptm.config import from_dict
from mmptm.encoders.base import ModalityTokens
from mmptm.fusion.single_stream import SingleStreamFusion
from mmptm.fusion.visual_embedding import VisualEmbeddingFusion
from mmptm.registry import FUSIONS

D = 16
STACK = {"layers": 2, "heads": 2, "mlp_ratio": 2.0}


def _fusion(**over) -> VisualEmbeddingFusion:
    torch.manual_seed(0)
    cfg = from_dict(
        VisualEmbeddingFusion.Config, {"type": "visual_embedding", "transformer": STACK, **over}
    )
    return VisualEmbeddingFusion(cfg, width=D, modalities=["text", "regions"]).eval()


def _plain(fusion: VisualEmbeddingFusion) -> SingleStreamFusion:
    """A single_stream fusion with the same stack and pooler weights."""
    cfg = from_dict(SingleStreamFusion.Config, {"type": "single_stream", "transformer": STACK})
    plain = SingleStreamFusion(cfg, width=D).eval()
    plain.load_state_dict(fusion.state_dict(), strict=False)
    return plain


def _tokens(seed: int = 0) -> dict[str, ModalityTokens]:
    g = torch.Generator().manual_seed(seed)
    text_mask = torch.ones(3, 5, dtype=torch.bool)
    text_mask[1, 3:] = False
    region_mask = torch.ones(3, 4, dtype=torch.bool)
    region_mask[0, 2:] = False
    region_mask[2, 1:] = False
    return {
        "text": ModalityTokens(torch.randn(3, 5, D, generator=g), text_mask),
        "regions": ModalityTokens(torch.randn(3, 4, D, generator=g), region_mask),
    }


def _whole_image(t: ModalityTokens) -> torch.Tensor:
    """[B,D]: the mean of each row's real visual tokens, one row at a time."""
    return torch.stack([t.tokens[b][t.mask[b]].mean(0) for b in range(len(t.tokens))])


def test_registered_and_every_text_token_gets_the_image_vl_bert() -> None:
    assert FUSIONS.get("visual_embedding") is VisualEmbeddingFusion
    fusion = _fusion()
    tokens = _tokens()
    v_BD = fusion.visual_proj(_whole_image(tokens["regions"]))
    text = tokens["text"]
    summed = {**tokens, "text": ModalityTokens(text.tokens + v_BD[:, None], text.mask)}
    with torch.no_grad():
        got, want = fusion(tokens), _plain(fusion)(summed)
    for m in ("text", "regions"):
        torch.testing.assert_close(got.hidden[m], want.hidden[m])
    torch.testing.assert_close(got.pooled["joint"], want.pooled["joint"])


def test_padded_regions_do_not_reach_the_text() -> None:
    fusion = _fusion()
    tokens = _tokens()
    r = tokens["regions"]
    noisy = r.tokens.masked_fill(~r.mask[..., None], 1e3)  # padding holds garbage
    with torch.no_grad():
        a = fusion(tokens)
        b = fusion({**tokens, "regions": ModalityTokens(noisy, r.mask)})
    torch.testing.assert_close(a.hidden["text"][tokens["text"].mask],
                               b.hidden["text"][tokens["text"].mask])  # fmt: skip


def test_b2t2_text_only_stack_image_at_cls_through_tanh() -> None:
    """``joint: false``: the stack reads the text alone; [CLS] gets tanh(W v + b), the other
    tokens tanh(b); the visual view's states are its encoder tokens."""
    fusion = _fusion(add_to="first", activation="tanh", joint=False)
    with torch.no_grad():
        fusion.visual_proj.bias.normal_()
    tokens = _tokens()
    proj = fusion.visual_proj
    text = tokens["text"]
    add_BLD = torch.tanh(proj.bias).expand_as(text.tokens).clone()
    add_BLD[:, 0] = torch.tanh(proj(_whole_image(tokens["regions"])))
    with torch.no_grad():
        got = fusion(tokens)
        want = _plain(fusion)({"text": ModalityTokens(text.tokens + add_BLD, text.mask)})
    torch.testing.assert_close(got.hidden["text"], want.hidden["text"])
    torch.testing.assert_close(got.pooled["joint"], want.pooled["joint"])
    assert torch.equal(got.hidden["regions"], tokens["regions"].tokens)


def test_b2t2_references_add_the_referred_region() -> None:
    """``boxes``: the text token that refers to region j gets region j's token added to its
    visual input, before the shared projection."""
    fusion = _fusion(add_to="first", activation="tanh", joint=False, boxes="regions")
    tokens = _tokens()
    refs = torch.full((3, 5), -1)
    refs[0, 2], refs[2, 4], refs[1, 1] = 1, 0, 3
    text, regions = tokens["text"], tokens["regions"]
    v_BLD = torch.zeros_like(text.tokens)
    v_BLD[:, 0] = _whole_image(regions)
    for b, i, j in ((0, 2, 1), (2, 4, 0), (1, 1, 3)):
        v_BLD[b, i] += regions.tokens[b, j]
    added = torch.tanh(fusion.visual_proj(v_BLD))
    with torch.no_grad():
        got = fusion(tokens, {"region_refs": refs})
        want = _plain(fusion)({"text": ModalityTokens(text.tokens + added, text.mask)})
        without = fusion(tokens, {})
    torch.testing.assert_close(got.hidden["text"], want.hidden["text"])
    assert not torch.allclose(got.hidden["text"], without.hidden["text"])


def test_gradients_reach_the_projection_and_the_visual_tokens() -> None:
    fusion = _fusion(joint=False).train()
    tokens = _tokens()
    r = tokens["regions"].tokens.clone().requires_grad_(True)
    out = fusion({**tokens, "regions": ModalityTokens(r, tokens["regions"].mask)})
    out.pooled["joint"].sum().backward()
    assert fusion.visual_proj.weight.grad.abs().sum() > 0
    assert r.grad[tokens["regions"].mask].abs().sum() > 0
    assert r.grad[~tokens["regions"].mask].abs().sum() == 0


def test_a_text_only_batch_runs_the_plain_stack() -> None:
    fusion = _fusion()
    text = _tokens()["text"]
    with torch.no_grad():
        torch.testing.assert_close(
            fusion({"text": text}).hidden["text"], _plain(fusion)({"text": text}).hidden["text"]
        )


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"visual": "image"}, r"fusion.visual='image' is not an encoder"),
        ({"visual": "text"}, "must differ"),
        ({"joint": False, "unimodal_layers": {"text": 1}}, "unimodal_layers"),
    ],
)
def test_config_errors_name_the_key(over, match) -> None:
    with pytest.raises(ValueError, match=match):
        _fusion(**over)
