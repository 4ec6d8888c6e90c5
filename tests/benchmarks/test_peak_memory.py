"""benchmarks/peak_memory.py: the extrapolation to the default batch, the adapters that give
base recipes their published input shapes, and one measurement in a child process."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import peak_memory as pm


def test_extrapolation_follows_the_value_that_grows_not_the_peak_at_small_batches():
    # live MB during a step at batch 2 and 4: activations (2nd value) grow 4 MB a sample,
    # the update (3rd) does not and is the peak at both small batches
    small = {"batch": 2, "live_mb": [10.0, 18.0, 25.0]}
    large = {"batch": 4, "live_mb": [10.0, 26.0, 25.0]}
    x = pm.extrapolate([small, large], 10)
    assert x["method"] == "curves"
    assert x["peak_mb"] == pytest.approx(18 + 4 * 8)  # a line through the peaks: 25 + 0.5 * 8
    assert x["mb_per_sample"] == pytest.approx(4.0)
    # different operations at the two batches (packed rows): only the peaks can be joined
    other = {"batch": 4, "live_mb": [10.0, 20.0, 26.0, 27.0]}
    y = pm.extrapolate([small, other], 10)
    assert y["method"] == "peaks" and y["peak_mb"] == pytest.approx(25 + 1 * 8)  # 1 MB a sample


def test_widen_pads_features_and_regions_with_empty_ones():
    feats = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4)
    batch = {
        "region_feats": feats.clone(),
        "region_boxes": torch.rand(2, 3, 4),
        "region_mask": torch.tensor([[True, True, False], [True, True, True]]),
        "region_labels": torch.ones(2, 3, dtype=torch.long),
        "input_ids": torch.ones(2, 3, dtype=torch.long),  # not a region key: untouched
    }
    out = pm.Widen({"region_feats": 6}, {"": 5})(batch, torch.Generator())
    assert out["region_feats"].shape == (2, 5, 6) and out["region_boxes"].shape == (2, 5, 4)
    assert torch.equal(out["region_feats"][:, :3, :4], feats)
    assert not out["region_feats"][:, 3:].any() and not out["region_feats"][..., 4:].any()
    assert out["region_mask"].tolist() == [
        [True, True, False, False, False],
        [True] * 3 + [False] * 2,
    ]
    assert out["region_labels"].shape == (2, 5) and out["input_ids"].shape == (2, 3)


def test_recipe_names():
    tiny = pm.recipe_names("tiny")
    assert "clip_tiny" in tiny and all(n.endswith("_tiny") for n in tiny)
    assert pm.recipe_names("clip_base,clip_tiny,clip_base") == ["clip_base", "clip_tiny"]
    with pytest.raises(SystemExit, match="no pre-training recipe 'nope'"):
        pm.recipe_names("nope")


@pytest.mark.slow
def test_a_measurement_in_a_child_process(tmp_path):
    world = pm.make_world(tmp_path / "world")
    row = pm.in_child("clip_tiny", world, 4, 2, False, 300)
    assert row["batch"] == 4 and row["shapes"]["pixels"] == [4, 3, 64, 64], row
    # alive through the step: the weights and AdamW's two moments, 4 bytes each
    assert row["start_mb"] >= 3 * 4 * row["params_m"] * 1e6 / 2**20
    assert row["peak_mb"] > row["start_mb"] and row["rss_peak_mb"] > row["rss_before_mb"]
    assert len(row["live_mb"]) > 100 and row["peak_mb"] == max(row["live_mb"])
