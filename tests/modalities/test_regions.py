"""The regions plug-in: regions.npz round trip, padding with masks, bad members named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmptm.modalities import DataContext
from mmptm.modalities.regions import RegionData, regions_npz_bytes


def _record(r: int, f: int = 4, c: int = 3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    x1y1 = rng.uniform(0, 0.5, (r, 2))
    return {
        "features": rng.normal(size=(r, f)),
        "boxes": np.concatenate([x1y1, x1y1 + 0.4], axis=1),
        "image_size": (64, 48),
        "probs": rng.dirichlet(np.ones(c), size=r),
        "labels": rng.integers(0, c, size=r),
    }


def _plugin() -> RegionData:
    return RegionData(RegionData.Config(), views=["regions"], context=DataContext())


def test_decode_and_pad_to_the_most_regions_in_the_batch():
    recs = [_record(3, seed=0), _record(1, seed=1)]
    items = [_plugin().decode({"regions.npz": regions_npz_bytes(r)}, {}, None) for r in recs]
    batch = _plugin().collate(items)
    assert batch["region_mask"].tolist() == [[True] * 3, [True, False, False]]
    assert batch["region_feats"].shape == (2, 3, 4) and batch["region_feats"].dtype == torch.float32
    torch.testing.assert_close(batch["region_feats"][0], torch.tensor(recs[0]["features"]).float())
    torch.testing.assert_close(
        batch["region_boxes"][1, 0], torch.tensor(recs[1]["boxes"][0]).float()
    )
    assert batch["region_labels"][1].tolist() == [int(recs[1]["labels"][0]), -1, -1]
    assert (
        batch["region_probs"][1, 1:].abs().sum() == 0
        and batch["region_feats"][1, 1:].abs().sum() == 0
    )


def test_optional_arrays_stay_optional():
    rec = {**_record(2), "probs": None, "labels": None}
    item = _plugin().decode({"regions.npz": regions_npz_bytes(rec)}, {}, None)
    assert set(item) == {"region_feats", "region_boxes"}
    assert set(_plugin().collate([item])) == {"region_feats", "region_boxes", "region_mask"}


def test_bad_members_are_named():
    with pytest.raises(ValueError, match=r"no regions.npz member; has \['jpg'\]"):
        _plugin().decode({"jpg": b""}, {}, None)
    import io

    buf = io.BytesIO()
    np.savez(buf, features=np.zeros((2, 4)), boxes=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="mismatch"):
        _plugin().decode({"regions.npz": buf.getvalue()}, {}, None)
    buf = io.BytesIO()
    np.savez(buf, features=np.zeros((2, 4)))
    with pytest.raises(ValueError, match="lacks 'boxes'"):
        _plugin().decode({"regions.npz": buf.getvalue()}, {}, None)
