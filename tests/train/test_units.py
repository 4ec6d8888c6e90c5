"""k-means for unit codebooks: recovery of well-separated blobs, the optimum of a tiny set
(brute force over every partition), Lloyd's fixed point, hierarchical leaf ids, the
reservoir sample, and ``mmptm units fit`` end to end (codebook → units plug-in)."""

from __future__ import annotations

import io
import itertools
import json
import logging

import numpy as np
import pytest
import torch

from mmptm.cli import main
from mmptm.data.shards import ShardWriter, expand_shards
from mmptm.modalities import DataContext
from mmptm.modalities.features import UnitsData
from mmptm.train.units import hierarchical_kmeans, kmeans, read_vectors


def blobs(centres: np.ndarray, per: int, spread: float, seed: int = 0):
    """(points [N,F] float32, label of each) around the given centres."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([c + spread * rng.standard_normal((per, centres.shape[1])) for c in centres])
    return x.astype(np.float32), np.repeat(np.arange(len(centres)), per)


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two labelings split the points the same way (up to renaming)."""
    pairs = set(zip(a.tolist(), b.tolist(), strict=True))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def labels_of(x: np.ndarray, c: torch.Tensor) -> np.ndarray:
    d = ((x[:, None, :].astype(np.float64) - c.double().numpy()[None]) ** 2).sum(-1)
    return d.argmin(1)


def test_well_separated_blobs_are_recovered_exactly():
    centres = np.random.default_rng(1).uniform(-50, 50, (6, 8))
    x, truth = blobs(centres, 40, 1.0)
    for seed in range(3):
        fit = kmeans(torch.from_numpy(x), 6, seed=seed)
        assert same_partition(labels_of(x, fit.centroids_KF), truth)
        means = np.stack([x[truth == j].mean(0) for j in range(6)])
        # each centroid is its blob's mean (independent numpy computation)
        order = labels_of(means, fit.centroids_KF)
        np.testing.assert_allclose(fit.centroids_KF.numpy()[order], means, atol=1e-4)
        inertia = sum(((x[truth == j] - means[j]) ** 2).sum() for j in range(6))
        assert fit.inertia == pytest.approx(inertia, rel=1e-5)


def test_inertia_reaches_the_brute_force_optimum_of_tiny_sets():
    for seed in range(4):
        rng = np.random.default_rng(seed)
        x = (rng.uniform(-3, 3, (3, 2)).repeat(3, 0) + rng.standard_normal((9, 2))).astype(
            np.float32
        )
        best = np.inf
        for labels in itertools.product(range(3), repeat=9):  # every partition into 3 groups
            lab = np.array(labels)
            if len(set(labels)) < 3:
                continue
            cost = sum(((x[lab == j] - x[lab == j].mean(0)) ** 2).sum() for j in range(3))
            best = min(best, cost)
        fits = [kmeans(torch.from_numpy(x), 3, seed=s).inertia for s in range(5)]
        assert min(fits) <= best * (1 + 1e-5) + 1e-6, (fits, best)
        assert min(fits) >= best * (1 - 1e-5) - 1e-6


def test_the_result_is_a_lloyd_fixed_point():
    x = np.random.default_rng(0).standard_normal((300, 5)).astype(np.float32)
    fit = kmeans(torch.from_numpy(x), 7, seed=0, tol=0.0, iters=300)
    lab = labels_of(x, fit.centroids_KF)  # every point at its nearest centroid (brute force)
    for j in range(7):
        np.testing.assert_allclose(fit.centroids_KF[j].numpy(), x[lab == j].mean(0), atol=1e-4)


def test_duplicates_and_k_larger_than_distinct_rows_do_not_break():
    x = torch.tensor([[0.0, 0.0]] * 5 + [[1.0, 1.0]] * 5)
    fit = kmeans(x, 3)
    assert fit.inertia == 0.0 and fit.centroids_KF.shape == (3, 2)
    with pytest.raises(ValueError, match="1 <= k <= vectors"):
        kmeans(x, 11)


def test_hierarchical_leaf_ids_follow_the_tree():
    rng = np.random.default_rng(0)
    tops = rng.uniform(-100, 100, (3, 4))
    subs = np.concatenate([t + rng.uniform(-10, 10, (3, 4)) for t in tops])  # 3 × 3 blobs
    x, truth = blobs(subs, 20, 0.3)
    fit = hierarchical_kmeans(torch.from_numpy(x), 2, 3)
    assert fit.centroids_KF.shape == (9, 4)
    leaves = labels_of(x, fit.centroids_KF)
    assert same_partition(leaves, truth)  # each sub-blob is one leaf
    assert same_partition(leaves // 3, truth // 3)  # leaf // branch = the top-level cluster


def _npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _shards(tmp_path, arrays, bad: bool = False) -> str:
    with ShardWriter(str(tmp_path / "feat-%06d.tar"), 5) as w:
        for i, a in enumerate(arrays):
            w.write({"__key__": f"k{i:03d}", "npy": _npy(a)})
        if bad:
            w.write({"__key__": "nan", "npy": _npy(np.full((2, a.shape[1]), np.nan, np.float32))})
            w.write({"__key__": "narrow", "npy": _npy(np.zeros((2, 1), np.float32))})
    return str(tmp_path / "feat-*.tar")


def test_reservoir_sample_is_uniform_and_seeded(tmp_path):
    rows = np.arange(1000, dtype=np.float32)[:, None]
    spec = _shards(tmp_path, np.split(rows, 20))  # 20 samples of 50 rows
    urls = expand_shards(spec)
    everything = read_vectors(urls)
    assert everything.x_NF[:, 0].tolist() == list(range(1000)) and everything.samples == 20
    first = read_vectors(urls, max_vectors=100, seed=0).x_NF[:, 0]
    assert len(set(first.tolist())) == 100
    assert np.array_equal(first, read_vectors(urls, max_vectors=100, seed=0).x_NF[:, 0])
    hits = np.zeros(1000)
    for seed in range(60):
        hits[read_vectors(urls, max_vectors=100, seed=seed).x_NF[:, 0].astype(int)] += 1
    quarters = hits.reshape(4, 250).sum(1) / (60 * 100)  # each quarter holds 1/4 of the sample
    np.testing.assert_allclose(quarters, 0.25, atol=0.03)


def test_units_fit_writes_a_codebook_the_units_plugin_reads(tmp_path, capsys):
    centres = np.random.default_rng(2).uniform(-20, 20, (4, 6))
    x, truth = blobs(centres, 30, 0.5)
    order = np.random.default_rng(0).permutation(len(x))
    spec = _shards(tmp_path, np.array_split(x[order], 12), bad=True)
    out = tmp_path / "cb" / "codebook.npy"
    argv = ["units", "fit", "--shards", spec, "--k", "4", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    codebook = np.load(out)
    assert codebook.shape == (4, 6) and codebook.dtype == np.float32
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["k"] == 4 and record["dim"] == 6 and record["vectors"] == 120
    assert record["skipped"] == 2 and len(record["shards"]) == 3 and record["inertia"] > 0
    assert "codebook →" in capsys.readouterr().out
    plugin = UnitsData(UnitsData.Config(codebook=str(out), frames=200), views=["units"],
                       context=DataContext())  # fmt: skip
    ids = plugin.decode({"npy": _npy(x)}, {}, None)["unit_ids"].numpy()
    assert same_partition(ids, truth)


def test_units_fit_logs_progress_lines_off_a_terminal(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MMPTM_PROGRESS", "auto")  # stderr is captured: not a terminal
    x, _ = blobs(np.random.default_rng(0).uniform(-20, 20, (4, 3)), 10, 0.5)
    spec = _shards(tmp_path, np.array_split(x, 8), bad=True)
    argv = ["units", "fit", "--shards", spec, "--levels", "2", "--branch", "2",
            "--out", str(tmp_path / "cb.npy")]  # fmt: skip
    with caplog.at_level(logging.INFO, logger="mmptm.progress"):
        assert main(argv) == 0
    lines = [r.getMessage().split(" |")[0] for r in caplog.records if r.name == "mmptm.progress"]
    # the inner k-means loops (leave=False) leave no line; the bad samples were read too
    assert lines == ["reading vectors: sample 10", "hierarchical k-means 2^2: leaf 4/4 (100%)"]


def test_units_fit_errors_are_one_line(tmp_path, capsys):
    x, _ = blobs(np.zeros((1, 3)), 5, 1.0)
    spec = _shards(tmp_path, [x])
    assert (
        main(["units", "fit", "--shards", spec, "--levels", "2", "--out", str(tmp_path / "c.npy")])
        == 2
    )
    assert "needs --branch" in capsys.readouterr().err
    assert (
        main(["units", "fit", "--shards", spec, "--k", "8", "--out", str(tmp_path / "c.npy")]) == 2
    )
    assert "5 vectors" in capsys.readouterr().err


def test_a_featurize_callable_makes_the_vectors(tmp_path):
    """fit_codebook over what a callable makes of each sample (HuBERT's audio features use
    this); its description lands in the json, bad widths are skipped and counted."""
    from mmptm.train.units import fit_codebook

    spec = _shards(tmp_path, [np.full((3, 2), float(i), np.float32) for i in range(6)])

    def double(sample):  # [T,2] → [T,4]; sample k003 is "bad"
        if sample["__key__"] == "k003":
            raise ValueError("unreadable")
        x = np.load(io.BytesIO(sample["npy"]))
        return np.concatenate([x, 2 * x], axis=1) if sample["__key__"] != "k004" else x

    got = read_vectors(expand_shards(spec), featurize=double)
    assert got.x_NF.shape == (12, 4) and got.skipped == 2 and got.samples == 4
    np.testing.assert_array_equal(got.x_NF[:, 2], 2 * got.x_NF[:, 0])
    out = tmp_path / "cb.npy"
    record = fit_codebook(spec, out, k=2, featurize=double, features={"kind": "doubled"})
    assert record["features"] == {"kind": "doubled"} and np.load(out).shape == (2, 4)
    assert json.loads(out.with_suffix(".json").read_text())["features"] == {"kind": "doubled"}
