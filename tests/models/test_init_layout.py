"""``init=``: a run takes the input layout its initial run was pre-trained with."""

from __future__ import annotations

import logging

from mmptm.config import from_dict
from mmptm.models.load import take_layout
from mmptm.recipe import RunConfig

XLMR = {"segments": 1, "separators": 2, "restart_positions": False}


def _run(text: dict | None = None, **tree) -> RunConfig:
    data = {"modalities": {"text": text}} if text is not None else {}
    return from_dict(RunConfig, {"init": "runs/xlmr", "data": data, **tree})


def test_the_pretrained_layout_replaces_the_recipes_defaults(caplog):
    # xnli.yaml states restart_positions: true, which is also the default
    recipe = _run({"max_len": 48, "restart_positions": True})
    with caplog.at_level(logging.INFO, logger="mmptm.models.load"):
        take_layout(recipe, _run({"max_len": 512, **XLMR}))
    text = recipe.data.modalities["text"]
    assert (text.segments, text.separators, text.restart_positions) == (1, 2, False)
    assert text.max_len == 48  # not a layout setting: the recipe's own
    assert "data.modalities.text.separators=2" in caplog.text


def test_a_recipe_without_text_settings_gets_them():
    recipe = _run()
    take_layout(recipe, _run(XLMR))
    assert recipe.data.modalities["text"].separators == 2


def test_a_run_pretrained_in_the_default_layout_leaves_the_recipe_its_choice():
    recipe = _run({"restart_positions": False})  # e.g. BERT-style positions on fine-tuning
    take_layout(recipe, _run({"max_len": 40, "restart_positions": True}))
    assert not recipe.data.modalities["text"].restart_positions
    untouched = _run()
    take_layout(untouched, _run())  # the initial run configured no text at all
    take_layout(untouched, _run({"max_len": 40}))  # nor moved its layout
    assert untouched.data.modalities == {}


def test_only_the_settings_the_initial_run_moved_are_taken():
    recipe = _run({"restart_positions": False})
    take_layout(recipe, _run({"separators": 2}))
    text = recipe.data.modalities["text"]
    assert (text.segments, text.separators, text.restart_positions) == (2, 2, False)
