"""``mmptm recipes``: every recipe with its family, modalities, parts, parameter count and what
it reproduces; the count is the real model's."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import cli_error, tiny_overrides

from mmptm import config
from mmptm.cli import main
from mmptm.encoders.base import VocabInfo
from mmptm.models.load import build_model, count_parameters
from mmptm.models.pretrain import PretrainModel
from mmptm.recipe import list_recipes, load_recipe


@pytest.fixture(autouse=True)
def no_user_recipes(monkeypatch):
    monkeypatch.delenv(config.RECIPE_PATH_ENV, raising=False)
    monkeypatch.setattr(config, "_ADDED_DIRS", [])


def _json(capsys, *args: str) -> list[dict]:
    assert main(["recipes", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_recipe_is_listed_with_its_family_modalities_and_parts(capsys, tmp_path,
                                                                     monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)  # from any folder: no tokenizer there, counts assume one
    rows = {r["name"]: r for r in _json(capsys)}
    assert sorted(rows) == list_recipes()
    for name, r in rows.items():
        assert r["family"] and r["modalities"] and r["summary"], name
        assert r["kind"] in ("pretrain", "finetune")
        assert r["parameters"] is not None or r["parameters_note"], name
    clip = rows["clip_tiny"]
    assert clip["modalities"] == ["text", "image"] and clip["fusion"] == "dual"
    assert clip["objectives"] == {"contrastive": "contrastive"}
    assert clip["reproduces"] == [{"system": "CLIP", "year": 2021, "paper": "Radford et al."}]
    assert clip["parameters_note"] == "with a vocabulary of 1000"  # _toyworld's info
    # a model that reads no text needs no tokenizer: its count is exact
    assert rows["wav2vec2_base"]["parameters_note"] == ""
    assert 94e6 < rows["wav2vec2_base"]["parameters"] < 96e6  # the paper's 95 M
    assert rows["vqa"]["fusion"] is None and "init run" in rows["vqa"]["parameters_note"]
    assert "answers" in rows["video_qa"]["parameters_note"]  # a file it needs is not there


def test_modality_filters_and_an_unknown_one_is_one_line(capsys):
    rows = _json(capsys, "--modality", "features")
    assert {r["name"] for r in rows} == set(list_recipes("features")) >= {"cbt_tiny"}
    assert all("features" in r["modalities"] for r in rows)
    line = cli_error(capsys, ["recipes", "--modality", "smell"])
    assert "unknown modality 'smell'" in line and "audio" in line


def test_the_table(capsys):
    assert main(["recipes", "--modality", "units"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["recipe", "kind", "family"]
    assert any(line.startswith("videobert_tiny ") and "VideoBERT (Sun et al., 2019)" in line
               for line in out)  # fmt: skip


@pytest.mark.parametrize("recipe", ["clip_tiny", "vilt_tiny", "lxmert_tiny", "wav2vec2_tiny"])
def test_the_count_on_the_meta_device_is_the_built_models(recipe):
    cfg = load_recipe(recipe)
    torch.manual_seed(0)
    built = PretrainModel(cfg.model, VocabInfo(vocab_size=1000))  # timm backbones included
    assert count_parameters(cfg, 1000) == sum(p.numel() for p in built.parameters())


def test_the_count_with_the_recipes_tokenizer_is_the_built_models(tiny_world, tmp_path):
    cfg = load_recipe("clip_tiny", tiny_overrides(tiny_world, tmp_path))
    model, tokenizer = build_model(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert count_parameters(cfg) == n == count_parameters(cfg, tokenizer.vocab_size)


def test_an_unknown_recipe_name_is_one_line_with_the_nearest(capsys):
    line = cli_error(capsys, ["pretrain", "clip_tin", "train.max_steps=1"])
    assert "unknown recipe 'clip_tin'" in line and "nearest: clip_tiny" in line
    line = cli_error(capsys, ["finetune", "vqaa", "init=runs/none"])
    assert "unknown recipe 'vqaa'" in line and "nearest: vqa" in line
