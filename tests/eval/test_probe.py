"""The linear probe on vectors whose class information is known by construction."""

from __future__ import annotations

import pytest
import torch

from mmptm.eval.probe import fit_logistic, format_probe, probe


def _blobs(n: int, classes: int, dim: int, spread: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=torch.Generator().manual_seed(99)) * 3
    y = torch.randint(classes, (n,), generator=g)
    return centres[y] + spread * torch.randn(n, dim, generator=g), y


def test_separable_classes_are_found_and_noise_is_not():
    r = probe(_blobs(300, 4, 16, 0.5, 0), _blobs(200, 4, 16, 0.5, 1))
    assert r["acc"] > 0.95 and r["n_train"] == 300 and r["n_test"] == 200
    # labels independent of the vectors: test accuracy near chance (1/4), far below train's
    x, _ = _blobs(300, 4, 16, 0.5, 2)
    y = torch.randint(4, (300,), generator=torch.Generator().manual_seed(3))
    xt, _ = _blobs(300, 4, 16, 0.5, 4)
    yt = torch.randint(4, (300,), generator=torch.Generator().manual_seed(5))
    r = probe((x, y), (xt, yt))
    assert r["acc"] < 0.4


def test_logistic_regression_matches_a_known_solution():
    # one feature, two classes split at 0: the fitted boundary -b/w sits near 0
    x = torch.linspace(-3, 3, 200)[:, None]
    y = (x[:, 0] > 0).long()
    w = fit_logistic(x, y, 2, l2=1e-2)
    slope = w[0, 1] - w[0, 0]
    bias = w[1, 1] - w[1, 0]
    assert slope > 0 and abs(float(-bias / slope)) < 0.05


def test_format_probe_shows_folds():
    text = format_probe({"a": {"acc": 0.5, "acc_std": 0.1, "chance": 0.2}})
    assert "50.0% ± 10.0" in text and "20.0%" in text
    with pytest.raises(KeyError):
        format_probe({"b": {"chance": 0.2}})
