"""PretrainModel composition: data-side ordering, shared data sides, per-step task sampling."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from conftest import text_image_model_config

from mmptm.encoders.base import VocabInfo
from mmptm.models.pretrain import PretrainModel, data_transforms
from mmptm.objectives.base import ForObjectives, TaskSampler
from mmptm.objectives.itm import SwapNegatives
from mmptm.objectives.mlm import MaskTokens
from mmptm.recipe import ModelConfig

VOCAB = VocabInfo(vocab_size=50, special_ids=frozenset({0, 1, 2, 3, 4}))


def _cfg(**extra) -> ModelConfig:
    return text_image_model_config(**extra)


def _batch(B: int = 6) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50, (B, 10), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(B, 10, dtype=torch.bool),
        "pixels": torch.randn(B, 3, 16, 16, generator=g),
    }


def test_negatives_run_before_masking_whatever_the_recipe_order():
    transforms = data_transforms(_cfg(), VOCAB)  # recipe lists mlm first
    assert [type(t) for t in transforms] == [SwapNegatives, MaskTokens]


def test_task_mix_trains_one_objective_per_batch_with_its_data_side_only():
    cfg = _cfg(task_mix={"mlm": 3.0, "itm": 1.0})
    transforms = data_transforms(cfg, VOCAB)
    assert isinstance(transforms[0], TaskSampler)
    assert all(isinstance(t, ForObjectives) for t in transforms[1:])
    model = PretrainModel(cfg, VOCAB).eval()
    seen = collections.Counter()
    for i in range(200):
        batch, g = _batch(), torch.Generator().manual_seed(i)
        original = batch["input_ids"].clone()
        for t in transforms:
            batch = t(batch, g)
        task = batch["__task__"]
        seen[task] += 1
        if task == "itm":  # conditional masking: the text stays whole on ITM batches
            assert torch.equal(batch["input_ids"], original) and "mlm_labels" not in batch
        else:  # and MLM batches have no negatives
            assert "itm_labels" not in batch and "mlm_labels" in batch
        if i < 10:
            terms = model(batch).terms
            assert {k.split("_")[0] for k in terms} == {task}
    assert seen["mlm"] / 200 == pytest.approx(0.75, abs=0.08)


def test_routes_train_each_source_on_its_own_objectives_and_data_sides():
    cfg = _cfg(routes={"mono": ["mlm"], "pairs": ["itm"]})
    transforms = data_transforms(cfg, VOCAB)
    model = PretrainModel(cfg, VOCAB).eval()
    for source, want in [("mono/en", "mlm"), ("pairs", "itm"), ("other", None)]:
        batch = {**_batch(), "__source__": source}
        original = batch["input_ids"].clone()
        for t in transforms:
            batch = t(batch, torch.Generator().manual_seed(0))
        assert ("mlm_labels" in batch) == (want in ("mlm", None))
        assert ("itm_labels" in batch) == (want in ("itm", None))
        if want == "itm":
            assert torch.equal(batch["input_ids"], original)  # no masking on its batches
        objectives = {k.split("_")[0] for k in model(batch).terms}
        assert objectives == ({want} if want else {"mlm", "itm"})
    with pytest.raises(ValueError, match=r"routes.pairs names \['xlco'\]"):
        data_transforms(_cfg(routes={"pairs": ["xlco"]}), VOCAB)


def test_task_mix_must_name_objectives():
    with pytest.raises(ValueError, match=r"task_mix names \['mrm'\]"):
        data_transforms(_cfg(task_mix={"mrm": 1.0}), VOCAB)


@dataclass
class _Shared:
    data_priority: ClassVar[int] = 20
    shared: ClassVar[bool] = True
    prob: float

    def __call__(self, batch, g):
        batch["calls"] = batch.get("calls", 0) + 1
        return batch


def test_a_shared_data_side_runs_once_and_must_agree(monkeypatch):
    from mmptm.objectives.mlm import MaskedLM

    monkeypatch.setattr(
        MaskedLM, "data_transform", classmethod(lambda cls, c, v: _Shared(c.mask_prob))
    )
    cfg = _cfg(objectives={"a": {"type": "mlm"}, "b": {"type": "mlm"}})
    transforms = data_transforms(cfg, VOCAB)
    assert len(transforms) == 1
    assert transforms[0]({}, torch.Generator())["calls"] == 1
    with_mix = data_transforms(_cfg(objectives=cfg.objectives, task_mix={"a": 1, "b": 1}), VOCAB)
    assert with_mix[1].objectives == frozenset({"a", "b"})
    bad = _cfg(objectives={"a": {"type": "mlm"}, "b": {"type": "mlm", "mask_prob": 0.3}})
    with pytest.raises(ValueError, match=r"share one _Shared data side"):
        data_transforms(bad, VOCAB)


def test_widths_give_dual_towers_and_projections_their_own_width():
    """``model.widths``: the image tower at 24 while text runs at 16; every parameter gets a
    gradient through the contrastive loss."""
    tree = {
        "widths": {"image": 24},
        "fusion": {"type": "dual", "transformer": {"layers": 1, "heads": 2}},
        "objectives": {"contrastive": {"type": "contrastive", "embed_dim": 8}},
    }
    model = PretrainModel(text_image_model_config(**tree), VOCAB)
    assert model.encoders["image"].width == 24 and model.encoders["text"].width == 16
    assert model.objectives["contrastive"].proj["image"].weight.shape == (8, 24)
    assert model.objectives["contrastive"].proj["text"].weight.shape == (8, 16)
    batch = {
        "input_ids": torch.randint(5, 50, (4, 6)),
        "attention_mask": torch.ones(4, 6, dtype=torch.bool),
        "pixels": torch.randn(4, 3, 16, 16),
    }
    out = model(batch)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None] == []


def test_widths_errors_name_the_key():
    with pytest.raises(ValueError, match=r"model.widths names \['audio'\]"):
        PretrainModel(text_image_model_config(widths={"audio": 8}), VOCAB)
    with pytest.raises(ValueError, match="fusion 'single_stream' mixes the modalities"):
        PretrainModel(text_image_model_config(widths={"image": 24}), VOCAB)
