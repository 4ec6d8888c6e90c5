"""VL-BERT, Unicoder-VL, ImageBERT and B2T2 at their published shapes: each count, on the
meta device with BERT's 30522 word pieces, is VisualBERT-base's plus (or minus) the parts
that set the system apart, counted by hand from the layer shapes; B2T2's image side is timm's
ResNet-152 as timm builds it."""

from __future__ import annotations

import timm
import torch

from mmptm.models.load import count_parameters
from mmptm.recipe import load_recipe

V, D = 30522, 768  # BERT-base's word pieces and width
LINEAR_DD = D * D + D
LN = 2 * D


def _count(recipe: str, *over: str) -> int:
    return count_parameters(load_recipe(recipe, list(over)), V)


def _classifier_head(out: int) -> int:
    """Linear-GELU-LN-Linear (the region classification / regression heads)."""
    return LINEAR_DD + LN + D * out + out


def test_base_shapes() -> None:
    for name in ("vlbert_base", "unicoder_vl_base", "imagebert_base", "b2t2_base"):
        cfg = load_recipe(name)
        t = cfg.model.fusion.transformer
        assert (cfg.model.width, t.layers, t.heads, t.prenorm) == (768, 12, 12, False), name
        assert cfg.model.encoders["text"].max_positions == 512
    for name in ("vlbert_base", "unicoder_vl_base", "imagebert_base"):
        cfg = load_recipe(name)
        assert cfg.model.encoders["regions"].feature_dim == 2048
        assert cfg.model.objectives["mrc"].num_classes == 1601  # Visual Genome's + background
    assert load_recipe("b2t2_base").model.encoders["image"].backbone.model_name == "resnet152"


def test_counts_are_visualbert_base_and_the_systems_own_parts() -> None:
    visualbert = _count("visualbert_base")
    itm, mrc, mrfr = D * 2 + 2, _classifier_head(1601), _classifier_head(2048)
    # VL-BERT: the visual feature embedding, masked RoI classification; no ITM, no pooler
    assert _count("vlbert_base") == visualbert + LINEAR_DD + mrc - itm - LINEAR_DD
    # Unicoder-VL: + masked object classification; ImageBERT: + MOC and feature regression
    assert _count("unicoder_vl_base") == visualbert + mrc
    assert _count("imagebert_base") == visualbert + mrc + mrfr
    # B2T2: the stack over text alone; the image: ResNet-152's trunk, a projection 2048 → D,
    # its layer norm and type embedding, and the dense layer into the embeddings
    with torch.device("meta"):
        resnet = sum(p.numel() for p in timm.create_model("resnet152", num_classes=0).parameters())
    text_only = _count("visualbert_base", "model.encoders.regions=__delete__")
    image = resnet + 2048 * D + D + LN + D
    assert _count("b2t2_base") == text_only + image + LINEAR_DD


def test_bert_base_is_inside_each() -> None:
    """BERT-base has 110M parameters (109.5M with its pooler): each system adds its visual
    side to it (VL-BERT, without BERT's pooler, 0.6M less)."""
    counts = {n: _count(f"{n}_base") for n in ("vlbert", "unicoder_vl", "imagebert", "b2t2")}
    assert all(109e6 < n for n in counts.values()), counts
    assert all(n < 117e6 for k, n in counts.items() if k != "b2t2"), counts
    assert 165e6 < counts["b2t2"] < 172e6  # + ResNet-152 (58M without its classifier)
