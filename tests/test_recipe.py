"""The run config: recipes and checkpoints of earlier versions load with today's keys; ranges."""

from __future__ import annotations

import pytest
from conftest import ROOT

from mmptm.config import ConfigError
from mmptm.recipe import load_run_config, run_config, upgrade

OLD = {
    "data": {
        "max_text_len": 24,
        "caption_languages": ["de", "en"],
        "restart_positions": False,
        "image_size": 32,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
    },
    "model": {
        "encoders": {
            "text": {"type": "text"},
            "image": {"type": "timm_image", "image_size": 32},
            "regions": {"type": "roi_regions", "mean": [0.5, 0.5, 0.5]},
        },
        "objectives": {"contrastive": {"type": "contrastive"}},
    },
}


def test_old_data_keys_move_to_the_text_plugin_and_the_image_encoders():
    tree = upgrade(OLD)
    assert tree["data"] == {
        "modalities": {
            "text": {"max_len": 24, "caption_languages": ["de", "en"], "restart_positions": False}
        }
    }
    image, roi = tree["model"]["encoders"]["image"], tree["model"]["encoders"]["regions"]
    assert image == {"type": "timm_image", "image_size": 32, "mean": OLD["data"]["image_mean"],
                     "std": OLD["data"]["image_std"]}  # fmt: skip
    assert roi["mean"] == [0.5, 0.5, 0.5]  # an encoder's own setting wins
    assert roi["image_size"] == 32 and "mean" not in tree["model"]["encoders"]["text"]
    assert OLD["data"]["max_text_len"] == 24  # the input tree is not modified
    cfg = run_config(tree)
    assert cfg.data.modalities["text"].max_len == 24
    assert not cfg.data.modalities["text"].restart_positions


def test_a_recipe_in_todays_keys_is_unchanged_and_a_bad_plugin_is_named():
    new = {"data": {"modalities": {"text": {"max_len": 12}}}}
    assert upgrade(new) == new
    with pytest.raises(ConfigError, match=r"plugins: cannot import 'no_such_module_x'"):
        run_config({"plugins": ["no_such_module_x"]})


@pytest.mark.parametrize(
    "override",
    ["train.log_every=0", "train.ckpt_every=0", "train.max_steps=0", "train.max_steps=-3",
     "train.grad_accum=0", "train.keep_checkpoints=-1", "data.batch_size=0",
     "data.num_workers=-1"],
)  # fmt: skip
def test_run_config_ranges_fail_before_training(override) -> None:
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"clip_tiny.yaml: {key}: must be >= "):
        load_run_config(str(ROOT / "configs/pretrain/clip_tiny.yaml"), [override])
