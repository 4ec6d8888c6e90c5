"""What parts declare they need, merged per view, and plug-ins built from it plus the recipe."""

from __future__ import annotations

import pytest

from mmptm.config import ConfigError
from mmptm.modalities import DataContext, Need, build_modalities, merge_needs, view_prefix
from mmptm.modalities.image import ImageData
from mmptm.modalities.text import TextData
from mmptm.registry import MODALITIES


def test_view_prefix():
    assert view_prefix("text", "text") == "" and view_prefix("text", "text2") == "text2_"
    assert view_prefix("image", "image") == "" and view_prefix("regions", "roi") == "roi_"


def test_every_plugin_is_registered_with_its_config():
    assert {"text", "image", "regions", "label", "answers"} <= set(MODALITIES.names())
    for name in MODALITIES.names():
        assert MODALITIES.config_class(name)().type == name


def test_needs_merge_per_view_and_facts_must_agree():
    a = ("model.encoders.image", {"image": Need("image", {"size": 64, "mean": (0.5,) * 3})})
    b = (
        "model.encoders.regions",
        {"image": Need("image", {"size": 64}), "regions": Need("regions")},
    )
    merged = merge_needs([a, b])
    assert list(merged) == ["image", "regions"]
    assert merged["image"] == Need("image", {"size": 64, "mean": (0.5,) * 3})
    with pytest.raises(ValueError, match=r"encoders.other and model.encoders.image disagree.*size"):
        merge_needs([a, ("model.encoders.other", {"image": Need("image", {"size": 32})})])
    with pytest.raises(ValueError, match="reads view 'image' as 'regions'"):
        merge_needs([a, ("x", {"image": Need("regions")})])
    # Mapping facts (text spans) merge key by key.
    s1 = ("fusion", {"text": Need("text", {"spans": {"entity": "entities"}})})
    s2 = ("objective", {"text": Need("text", {"spans": {"tag": "tags"}})})
    assert merge_needs([s1, s2])["text"].facts["spans"] == {"entity": "entities", "tag": "tags"}


def _image_needs(size=16):
    return {"image": Need("image", {"size": size, "mean": [0.5] * 3, "std": [0.25] * 3})}


def test_declared_facts_fill_the_plugin_config_and_recipe_settings_the_rest():
    configs = {"image": ImageData.Config(crop_scale=[0.5, 1.0])}
    (image,) = build_modalities(_image_needs(), configs, DataContext())
    assert isinstance(image, ImageData)
    assert (
        image.cfg.size == 16 and image.cfg.std == [0.25] * 3 and image.cfg.crop_scale == [0.5, 1.0]
    )
    # A recipe that states a declared fact differently is told to leave it to the encoder.
    clash = {"image": ImageData.Config(size=32)}
    with pytest.raises(ConfigError, match=r"data.modalities.image.size=32 contradicts.*16"):
        build_modalities(_image_needs(), clash, DataContext())
    same = {"image": ImageData.Config(size=16)}
    assert build_modalities(_image_needs(), same, DataContext())[0].cfg.size == 16


def test_views_of_one_modality_share_one_plugin(tiny_tokenizer):
    needs = {"text": Need("text"), "text2": Need("text")}
    (text,) = build_modalities(needs, {}, DataContext(tokenizer=tiny_tokenizer))
    assert isinstance(text, TextData) and text.views == ["text", "text2"]
    with pytest.raises(ValueError, match="at most 1 view"):
        build_modalities({"a": Need("label"), "b": Need("label")}, {}, DataContext())


def test_unknown_modality_and_undeclarable_fact_are_named():
    with pytest.raises(Exception, match=r"unknown modality 'smell' at 'view 'nose''"):
        build_modalities({"nose": Need("smell")}, {}, DataContext())
    with pytest.raises(ConfigError, match=r"declares data.modalities.label.colour"):
        build_modalities({"label": Need("label", {"colour": "red"})}, {}, DataContext())


def test_an_image_without_a_declared_size_is_an_error():
    with pytest.raises(ValueError, match="no encoder declared the image size"):
        build_modalities({"image": Need("image")}, {}, DataContext())


def test_declared_spans_merge_with_the_recipes_and_clashes_are_named(tiny_tokenizer):
    ctx = DataContext(tokenizer=tiny_tokenizer)
    needs = {"text": Need("text", {"spans": {"entity": "entities"}})}
    recipe = {"text": TextData.Config(spans={"tag": "tags"})}
    (text,) = build_modalities(needs, recipe, ctx)
    assert text.cfg.spans == {"tag": "tags", "entity": "entities"}
    clash = {"text": TextData.Config(spans={"entity": "links"})}
    with pytest.raises(ConfigError, match=r"disagree on data.modalities.text.spans.entity"):
        build_modalities(needs, clash, ctx)
