"""The run config: recipes and checkpoints of earlier versions load with today's keys; ranges;
recipes by name (the package's and the user's folders)."""

from __future__ import annotations

import copy

import pytest

from mmptm import config
from mmptm.config import ConfigError, apply_overrides, load_yaml_tree, save_config
from mmptm.recipe import (
    FAMILIES,
    add_recipe_dir,
    list_recipes,
    load_recipe,
    load_run_config,
    recipe_kind,
    recipe_modalities,
    recipe_path,
    run_config,
    upgrade,
)

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
    cfg = load_run_config(recipe)
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
        load_run_config(str(recipe_path("clip_tiny")), [override])


# ---------------------------------------------------------------------------------------------
# Recipes by name


@pytest.fixture
def no_user_recipes(monkeypatch):
    """The package's recipes alone on the search path (no MMPTM_RECIPE_PATH, none added)."""
    monkeypatch.delenv(config.RECIPE_PATH_ENV, raising=False)
    monkeypatch.setattr(config, "_ADDED_DIRS", [])


def test_every_shipped_recipe_is_named_and_says_what_it_is(no_user_recipes):
    names = list_recipes()
    files = sorted(config.PACKAGE_RECIPES.glob("*/*.yaml"))
    shipped = [p.stem for p in files if not p.stem.startswith("_")]
    assert names == sorted(shipped) and len(set(shipped)) == len(shipped)  # no name twice
    assert {"clip_tiny", "vqa", "xnli", "wav2vec2_base"} <= set(names)
    for name in names:
        cfg = load_recipe(name)
        assert recipe_path(name).parent.name == recipe_kind(name), name
        assert cfg.info.family in FAMILIES and cfg.info.summary, name
        assert recipe_modalities(cfg), name
        assert (recipe_kind(name) == "finetune") == bool(cfg.init), name


def test_a_name_a_qualified_name_and_a_path_load_the_same_recipe(no_user_recipes, tmp_path,
                                                                 monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)  # names do not depend on the working directory
    cfg = load_recipe("clip_tiny", ["train.max_steps=7"])
    assert cfg.train.max_steps == 7 and cfg.info.reproduces[0].system == "CLIP"
    assert load_recipe("pretrain/clip_tiny", ["train.max_steps=7"]) == cfg
    assert load_run_config(str(recipe_path("clip_tiny")), ["train.max_steps=7"]) == cfg
    assert load_yaml_tree("vqa") == load_yaml_tree(recipe_path("vqa"))
    # a saved config (what a run keeps) reloads as the recipe it came from
    save_config(cfg, tmp_path / "config.yaml")
    assert load_run_config("config.yaml") == cfg


def test_an_unknown_name_is_one_line_with_the_nearest_names(no_user_recipes):
    with pytest.raises(ConfigError) as e:
        load_recipe("clip_tin")
    msg = str(e.value)
    assert "\n" not in msg and "unknown recipe 'clip_tin'" in msg
    assert "nearest: clip_tiny" in msg
    with pytest.raises(ConfigError, match=r"unknown recipe 'zzzz'.*mmptm recipes"):
        recipe_path("zzzz")
    # the path where recipes were before they moved into the package
    with pytest.raises(ConfigError, match="'clip_tiny' ships with mmptm: name it"):
        load_recipe("configs/pretrain/clip_tiny.yaml")


def test_the_users_folders_come_first_and_may_extend_the_package_recipes(
    no_user_recipes, tmp_path, monkeypatch
):
    mine, env = tmp_path / "mine", tmp_path / "env"
    (mine / "sub").mkdir(parents=True)
    env.mkdir()
    # a recipe of the package's name, extending it by name (its own file is passed over)
    (mine / "clip_tiny.yaml").write_text("base: clip_tiny\ntrain: {max_steps: 7}\n")
    # a user's recipe in another folder, on a package recipe and a shared fragment
    (mine / "sub" / "_small.yaml").write_text("model: {width: 64}\n")
    (mine / "sub" / "my_clip.yaml").write_text("base: [clip_tiny, _small]\n")
    (env / "my_clip.yaml").write_text("base: vilt_tiny\n")
    (env / "env_only.yaml").write_text("base: xnli\n")
    monkeypatch.setenv(config.RECIPE_PATH_ENV, str(env))
    assert recipe_path("my_clip") == env / "my_clip.yaml"
    assert add_recipe_dir(mine) == mine.resolve()
    assert recipe_path("my_clip") == mine.resolve() / "sub" / "my_clip.yaml"  # added first
    assert (
        recipe_path("env_only") == env / "env_only.yaml" and recipe_kind("env_only") == "finetune"
    )
    names = list_recipes()
    assert {"my_clip", "env_only", "clip_tiny", "vqa"} <= set(names) and "_small" not in names
    package = load_run_config(str(config.PACKAGE_RECIPES / "pretrain" / "clip_tiny.yaml"))
    ours = load_recipe("clip_tiny")
    assert ours.train.max_steps == 7 and ours.model == package.model
    mixed = load_recipe("my_clip")
    assert mixed.model.width == 64 and set(mixed.model.encoders) == set(package.model.encoders)
    assert recipe_kind("my_clip") == "pretrain"


def test_recipe_folders_and_bases_fail_clearly(no_user_recipes, tmp_path):
    with pytest.raises(ConfigError, match="no such folder of recipes"):
        add_recipe_dir(tmp_path / "missing")
    (tmp_path / "loop.yaml").write_text("base: loop\n")
    with pytest.raises(ConfigError, match="inheritance cycle"):
        load_yaml_tree(tmp_path / "loop.yaml")
    (tmp_path / "typo.yaml").write_text("base: clip_tinny\n")
    with pytest.raises(ConfigError, match="unknown recipe 'clip_tinny'.*nearest: clip_tiny"):
        load_yaml_tree(tmp_path / "typo.yaml")


def test_list_recipes_by_modality(no_user_recipes):
    audio = list_recipes("audio")
    assert {"clap_tiny", "wav2vec2_tiny", "audio_classification"} <= set(audio)
    assert "clip_tiny" not in audio
    assert all("audio" in recipe_modalities(load_recipe(n)) for n in audio)
    assert "vqa" in list_recipes("regions")  # its modalities: info.modalities (no encoders)
    with pytest.raises(ConfigError, match="unknown modality 'smell'; choices: audio"):
        list_recipes("smell")
