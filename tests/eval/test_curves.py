"""``mmptm plot``: curves of runs from their metrics.jsonl."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import cli_error
from PIL import Image

from mmptm.cli import main
from mmptm.eval.curves import _labels, plot_curves, read_metrics, select_metrics, smooth

#: matplotlib's first two default colours (C0, C1): the two runs' lines
BLUE, ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)


def _run(folder, rows, tail: str = ""):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return folder


def _rows(n: int, rate: float) -> list[dict]:
    return [{"step": s, "samples": 8 * s, "elapsed_s": 0.5 * s, "lr": 1e-3,
             "loss": 3 * math.exp(-rate * s), "mlm_loss": 2 * math.exp(-rate * s),
             "mlm_acc": 1 - math.exp(-rate * s)} for s in range(1, n + 1)]  # fmt: skip


def _pixels_near(png, rgb, tol: int = 40) -> int:
    image = np.asarray(Image.open(png).convert("RGB")).astype(int)
    return int((np.abs(image - np.array(rgb)).sum(-1) < tol).sum())


def test_smoothing_is_tensorboards_debiased_moving_average():
    values = [3.0, 1.0, float("nan"), 4.0, 1.0, 5.0]
    w = 0.6
    finite = [v for v in values if math.isfinite(v)]
    # the debiased EMA of the first n finite points = their average weighted w^(n-1-i)
    expected = []
    for n in range(1, len(finite) + 1):
        weights = [w ** (n - 1 - i) for i in range(n)]
        expected.append(sum(a * b for a, b in zip(weights, finite)) / sum(weights))
    got = smooth(values, w)
    assert math.isnan(got[2])
    assert [g for g in got if math.isfinite(g)] == pytest.approx(expected)
    assert smooth(values, 0.0)[:2] == [3.0, 1.0]
    with pytest.raises(ValueError, match="in \\[0, 1\\)"):
        smooth(values, 1.0)


def test_two_runs_are_drawn_in_their_own_colours(tmp_path):
    a = _run(tmp_path / "a", _rows(40, 0.1))
    b = _run(tmp_path / "b", _rows(30, 0.05))
    out = tmp_path / "figs" / "curves.png"
    assert main(["plot", str(a), str(b), "--metric", "*_loss", "--metric", "mlm_acc",
                 "--out", str(out), "--x", "samples"]) == 0  # fmt: skip
    image = np.asarray(Image.open(out).convert("L"))
    assert image.std() > 10  # not blank
    assert _pixels_near(out, BLUE) > 200 and _pixels_near(out, ORANGE) > 200
    # one run only: the other colour is gone (the lines are the runs', not decoration)
    plot_curves([a], ["loss"], tmp_path / "one.png", x="time", log_y=True)
    assert _pixels_near(tmp_path / "one.png", BLUE) > 100
    assert _pixels_near(tmp_path / "one.png", ORANGE) == 0
    # a run of one row (a short fine-tuning) shows as a dot
    c = _run(tmp_path / "c", _rows(1, 0.1))
    plot_curves([c], ["loss"], tmp_path / "dot.png")
    assert _pixels_near(tmp_path / "dot.png", BLUE) > 20


def test_metric_patterns_pick_in_order_and_unknown_ones_list_what_there_is(tmp_path, capsys):
    available = ["loss", "mlm_loss", "itm_loss", "mlm_acc", "lr"]
    assert select_metrics(["*_loss", "lr"], available) == ["mlm_loss", "itm_loss", "lr"]
    assert select_metrics(["mrfr_loss", "lr"], available, skip_missing=True) == ["lr"]
    a = _run(tmp_path / "a", _rows(5, 0.1))
    line = cli_error(capsys, ["plot", str(a), "--metric", "nope", "--out", str(tmp_path / "x.png")])
    assert "no run has a metric 'nope'; they have: loss, lr, mlm_acc, mlm_loss" in line
    assert not (tmp_path / "x.png").exists()


def test_bad_runs_are_one_line_naming_the_file(tmp_path, capsys):
    out = str(tmp_path / "x.png")
    line = cli_error(capsys, ["plot", str(tmp_path / "missing"), "--out", out])
    assert "missing: no metrics.jsonl (not a run directory?)" in line
    bad = _run(tmp_path / "bad", _rows(3, 0.1)[:1], tail="{oops\n" + json.dumps({"step": 3}))
    line = cli_error(capsys, ["plot", str(bad), "--out", out])
    assert f"{bad}/metrics.jsonl:2: not a JSON row" in line
    old = _run(tmp_path / "old", [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}])
    line = cli_error(capsys, ["plot", str(old), "--x", "samples", "--out", out])
    assert "rows have no 'samples'" in line and "use --x step" in line
    line = cli_error(capsys, ["plot", str(old), "--smooth", "-0.5", "--out", out])
    assert "--smooth -0.5: a smoothing weight is in [0, 1)" in line


def test_a_half_written_last_row_is_left_out_and_labels_tell_runs_apart(tmp_path):
    a = _run(tmp_path / "x" / "run", _rows(3, 0.1), tail='{"step": 4, "lo')
    assert [r["step"] for r in read_metrics(a)] == [1, 2, 3]
    b = _run(tmp_path / "y" / "run", _rows(3, 0.1))

    assert list(_labels([a, b])) == ["x/run", "y/run"]
    assert list(_labels({"mlm": a, "mlm+tlm": b})) == ["mlm", "mlm+tlm"]
