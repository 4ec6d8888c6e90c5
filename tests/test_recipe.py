"""The run config: recipes and checkpoints of earlier versions load with today's keys; ranges."""

from __future__ import annotations

import copy

import pytest
from conftest import ROOT

from mmptm.config import ConfigError, apply_overrides, load_yaml_tree, save_config
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
    facts = {"image_size": 32, "mean": OLD["data"]["image_mean"], "std": OLD["data"]["image_std"]}
    assert image == {"type": "timm_image", "backbone": facts}
    assert roi["backbone"]["mean"] == [0.5, 0.5, 0.5]  # an encoder's own setting wins
    assert roi["backbone"]["image_size"] == 32
    assert tree["model"]["encoders"]["text"] == {"type": "text"}
    assert OLD["data"]["max_text_len"] == 24  # the input tree is not modified
    cfg = run_config(tree)
    assert cfg.data.modalities["text"].max_len == 24
    assert not cfg.data.modalities["text"].restart_positions


def _flat_backbones(tree: dict) -> dict:
    """``tree`` as versions before the ``backbone`` block saved it: its keys on the encoder."""
    tree = copy.deepcopy(tree)
    for enc in tree["model"]["encoders"].values():
        for key, value in enc.pop("backbone", {}).items():
            enc["freeze_backbone" if key == "freeze" else key] = value
    return tree


@pytest.mark.parametrize("recipe", ["clip_tiny", "vilt_tiny", "video_clip_tiny"])
def test_an_old_checkpoints_flat_backbone_keys_load_as_the_backbone_block(recipe, tmp_path):
    cfg = load_run_config(str(ROOT / f"configs/pretrain/{recipe}.yaml"))
    save_config(cfg, tmp_path / "config.yaml")  # what a checkpoint keeps
    old = _flat_backbones(load_yaml_tree(tmp_path / "config.yaml"))
    assert all("backbone" not in enc for enc in old["model"]["encoders"].values())
    assert run_config(old) == cfg
    upgraded = upgrade(old)
    assert upgrade(upgraded) == upgraded


def test_every_backbone_encoder_reads_its_flat_keys_and_a_flat_override_wins():
    vit = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 0, "num_heads": 2}
    backbones = {
        "image": {"model_name": "vit_tiny_patch16_224", "model_kwargs": vit, "image_size": 32,
                  "freeze": True},
        "regions": {"weights": "w.pt", "mean": [0.5] * 3, "std": [0.25] * 3},
        "video": {"model_name": "r2plus1d_18", "image_size": 32},
    }  # fmt: skip
    types = {"image": "timm_image", "regions": "roi_regions", "video": "video_backbone"}
    new = {"model": {
        "encoders": {k: {"type": t, "backbone": backbones[k]} for k, t in types.items()},
        "objectives": {"contrastive": {"type": "contrastive", "modalities": ["image", "video"]}},
    }}  # fmt: skip
    old = _flat_backbones(new)
    assert old["model"]["encoders"]["image"]["freeze_backbone"] is True
    cfg = run_config(old)
    assert cfg == run_config(new)
    assert cfg.model.encoders["video"].backbone.image_size == 32
    assert cfg.model.encoders["video"].backbone.std is None  # the video network's own default
    over = apply_overrides(new, ["model.encoders.image.image_size=48"])  # as users wrote it
    assert run_config(over).model.encoders["image"].backbone.image_size == 48


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
