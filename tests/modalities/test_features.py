"""The features and units plug-ins: reading [T,F] arrays, uniform subsampling, padding,
bad arrays, nearest-centroid units against a brute-force check, and both in the pipeline."""

from __future__ import annotations

import io
import pickle
import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from mmptm.data.pipeline import Loader, stream_config
from mmptm.data.shards import ShardWriter
from mmptm.modalities import DataContext, Need
from mmptm.modalities.features import FeaturesData, UnitsData, nearest
from mmptm.recipe import DataConfig


def npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(array))
    return buf.getvalue()


def features(**cfg) -> FeaturesData:
    return FeaturesData(
        FeaturesData.Config(**{"dim": 4, **cfg}), views=["features"], context=DataContext()
    )


def units(codebook, view="units", **cfg) -> UnitsData:
    return UnitsData(
        UnitsData.Config(codebook=str(codebook), **cfg), views=[view], context=DataContext()
    )


def ramp(T: int, F: int = 4, dtype=np.float32) -> np.ndarray:
    """Row i is all i: which rows were kept is read off the values."""
    return np.repeat(np.arange(T, dtype=dtype)[:, None], F, axis=1)


def test_features_are_read_as_float32_padded_and_masked():
    p = features()
    a = p.decode({"npy": npy(ramp(3, dtype=np.float16))}, {}, None)
    b = p.decode({"npy": npy(ramp(5) + 0.25)}, {}, None)
    assert a["features"].dtype == torch.float32
    batch = p.collate([a, b])
    assert batch["features"].shape == (2, 5, 4)
    assert batch["features_mask"].tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    torch.testing.assert_close(batch["features"][0, :3], torch.from_numpy(ramp(3)))
    assert not batch["features"][0, 3:].any()
    torch.testing.assert_close(batch["features"][1], torch.from_numpy(ramp(5) + 0.25))


def test_long_sequences_are_subsampled_uniformly():
    p = features(frames=8)
    kept = p.decode({"npy": npy(ramp(40))}, {}, None)["features"][:, 0].tolist()
    assert kept == [int((k + 0.5) * 5) for k in range(8)]  # segment centres: 2, 7, ..., 37
    drawn = set()
    for seed in range(6):
        rows = p.decode({"npy": npy(ramp(40))}, {}, random.Random(seed))["features"][:, 0]
        assert [int(r) // 5 for r in rows] == list(range(8))  # one row in each segment
        drawn.add(tuple(rows.tolist()))
    assert len(drawn) > 1


def test_the_member_name_is_a_setting():
    p = features(member="clip.npy")
    assert p.decode({"clip.npy": npy(ramp(2))}, {}, None)["features"].shape == (2, 4)
    with pytest.raises(ValueError, match=r"no clip.npy member; has \['npy'\]"):
        p.decode({"npy": npy(ramp(2))}, {}, None)


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.full((3, 4), np.nan, np.float32), "NaN or Inf"),
        (np.array([[0, 1, 2, np.inf]], np.float32), "NaN or Inf"),
        (np.zeros(4, np.float32), r"shape \(4,\) is not \[T,4\]"),
        (np.zeros((2, 3), np.float32), r"shape \(2, 3\) is not \[T,4\]"),
        (np.zeros((0, 4), np.float32), r"shape \(0, 4\) is not \[T,4\] with T >= 1"),
        (np.zeros((2, 4), np.int64), "expected a float array, got int64"),
    ],
)
def test_bad_arrays_raise_value_errors(array, message):
    with pytest.raises(ValueError, match=message):
        features().decode({"npy": npy(array)}, {}, None)


def test_bytes_that_are_no_npy_raise_value_errors():
    for data in (b"", b"garbage", npy(ramp(3))[:60]):
        with pytest.raises(ValueError, match="npy: "):
            features().decode({"npy": data}, {}, None)
    with pytest.raises(ValueError, match="not an npy array"):  # pickled objects are refused
        features().decode({"npy": npy(np.array([{"a": 1}], dtype=object))}, {}, None)


def test_unset_facts_are_named(tmp_path):
    with pytest.raises(ValueError, match="features.dim is unset"):
        features(dim=0)
    with pytest.raises(ValueError, match="units.codebook is unset"):
        units("")
    with pytest.raises(ValueError, match="cannot be read"):
        units(tmp_path / "missing.npy")


# -- units ---------------------------------------------------------------------------------


def test_nearest_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    x, c = torch.randn(200, 6, generator=g), torch.randn(17, 6, generator=g)
    ids, d2 = nearest(x, c)
    brute = ((x[:, None, :].double() - c[None].double()) ** 2).sum(-1)  # [N,K]
    assert torch.equal(ids, brute.argmin(1))
    torch.testing.assert_close(d2.double(), brute.min(1).values, atol=1e-4, rtol=1e-5)


@pytest.fixture
def codebook(tmp_path):
    path = tmp_path / "codebook.npy"
    np.save(path, np.array([[0, 0, 0, 0], [10, 0, 0, 0], [0, 0, 10, 10]], np.float32))
    return path


def test_units_are_the_nearest_codebook_rows_padded_with_zero(codebook):
    p = units(codebook, view="audio_units")  # another view name: prefixed keys
    a = p.decode({"npy": npy([[9, 1, 0, 0], [1, 0, 9, 11], [0.5, 0, 0, 0]])}, {}, None)
    b = p.decode({"npy": npy(np.float16([[0, 1, 10, 10]]))}, {}, None)
    batch = p.collate([a, b])
    assert batch["audio_units_unit_ids"].tolist() == [[1, 2, 0], [2, 0, 0]]
    assert batch["audio_units_unit_mask"].tolist() == [[True] * 3, [True, False, False]]
    with pytest.raises(ValueError, match=r"shape \(1, 3\) is not \[T,4\]"):  # F from the codebook
        p.decode({"npy": npy(np.zeros((1, 3), np.float32))}, {}, None)


def test_a_worker_loads_the_codebook_once(codebook, monkeypatch):
    import mmptm.modalities.features as mod

    p = pickle.loads(pickle.dumps(units(codebook)))  # as a spawned loader worker gets it
    assert p._codebook_KF is None  # the pickle does not carry it
    loads = []
    real = mod.load_codebook
    monkeypatch.setattr(mod, "load_codebook", lambda path: loads.append(path) or real(path))
    for _ in range(3):
        p.decode({"npy": npy([[9.0, 0, 0, 0]])}, {}, None)
    assert loads == [str(codebook)]


# -- in the pipeline -----------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_features_and_units_in_the_pipeline_skip_a_bad_sample(tmp_path, codebook, workers):
    with ShardWriter(str(tmp_path / "f-%06d.tar"), 3) as w:
        for i in range(7):
            x = ramp(4 + i) % 11 + 0.25 if i != 3 else np.full((4, 4), np.nan, np.float32)
            w.write({"__key__": f"k{i}", "npy": npy(x.astype(np.float32)), "txt": "x"})
    needs = {
        "features": Need("features", {"dim": 4}),
        "units": Need("units", {"codebook": str(codebook)}),
    }
    cfg = DataConfig(
        train=",".join(w.shards),
        batch_size=2,
        modalities={
            "features": {"type": "features", "frames": 6},
            "units": {"type": "units", "frames": 6},
        },
    )
    sc = stream_config(cfg, None, needs=needs)
    # evaluation: both plug-ins keep the same rows (training draws their offsets apart)
    sc = replace(sc, decoder=replace(sc.decoder, train=False), shuffle=False, drop_last=False)
    loader = Loader(sc, num_workers=workers)
    batches = list(loader._epoch_batches())
    assert sorted(k for b in batches for k in b["__key__"]) == [f"k{i}" for i in range(7) if i != 3]
    assert loader.skipped == 1
    for b in batches:
        x, ids = b["features"], b["unit_ids"]
        assert x.shape[1] <= 6 and x.shape[1:] == (x.shape[1], 4)
        # a row (v,v,v,v) is nearest (0,0,0,0) below v = 5 and (0,0,10,10) above
        want = torch.where(x[..., 0] > 5, 2, 0)
        assert torch.equal(ids, want.masked_fill(~b["unit_mask"], 0))
        assert torch.equal(b["features_mask"], b["unit_mask"])
