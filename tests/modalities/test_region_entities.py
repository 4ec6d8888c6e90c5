"""The regions plug-in's entity ids: one id or null per region, looked up, padded with -1."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmptm.modalities.base import DataContext
from mmptm.modalities.regions import RegionData, regions_npz_bytes


def _sample(n: int) -> dict:
    rec = {"features": np.zeros((n, 2)), "boxes": np.zeros((n, 4)), "image_size": [8, 8]}
    return {"regions.npz": regions_npz_bytes(rec)}


def test_region_entity_ids(tmp_path):
    (tmp_path / "ids.txt").write_text("Q1\nQ2\nQ3\n")
    cfg = RegionData.Config(entities="region_entities", entity_vocabulary=str(tmp_path / "ids.txt"))
    plugin = RegionData(cfg, views=["regions"], context=DataContext())
    assert "region_entity_ids" in plugin.view_keys("regions")
    a = plugin.decode(_sample(3), {"region_entities": ["Q3", None, "Q9"]}, None)
    b = plugin.decode(_sample(1), {"region_entities": [1]}, None)  # an integer is the row
    c = plugin.decode(_sample(2), {}, None)  # no field: no entity
    batch = plugin.collate([a, b, c])
    assert batch["region_entity_ids"].tolist() == [[2, -1, -1], [1, -1, -1], [-1, -1, -1]]
    assert plugin.unknown_ids == 1  # Q9 dropped and counted
    with pytest.raises(ValueError, match="one entity id or null per region"):
        plugin.decode(_sample(2), json.loads('{"region_entities": ["Q1"]}'), None)
    assert "region_entity_ids" not in RegionData(
        RegionData.Config(), views=["regions"], context=DataContext()
    ).view_keys("regions")
