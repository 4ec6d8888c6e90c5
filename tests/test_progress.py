"""Progress: a bar on a terminal, log lines at a fixed cadence elsewhere, nothing when off."""

from __future__ import annotations

import io
import logging
import sys

import pytest
from tqdm import tqdm

from mmptm.progress import ENV, LineProgress, progress_bar, progress_mode


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_mode_follows_the_terminal_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr("sys.stderr", io.StringIO())  # a pipe, a file, a CI log
    assert progress_mode() == "lines"
    monkeypatch.setattr("sys.stderr", _Terminal())
    assert progress_mode() == "bar"
    monkeypatch.setenv(ENV, "lines")
    assert progress_mode() == "lines"
    assert progress_mode("off") == "off"  # an argument beats the environment
    monkeypatch.setenv(ENV, "loud")
    with pytest.raises(ValueError, match=r"MMPTM_PROGRESS='loud': expected one of auto"):
        progress_mode()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "mmptm.progress"]


def test_lines_every_n_updates_with_count_rate_and_eta(caplog):
    clock = _Clock()
    bar = LineProgress(total=10, desc="run", unit="step", initial=2, every=3, clock=clock)
    with caplog.at_level(logging.INFO):
        for step in range(3, 11):  # resumed at step 2: steps 3..10
            clock.now += 5.0 if step == 3 else 0.5  # a slow first step (loader start-up)
            bar.set_postfix(loss=f"{1 / step:.3f}")
            bar.update(1)
        bar.close()
        bar.close()  # a second close adds nothing
    lines = _lines(caplog)
    assert [line.split(" (")[0] for line in lines] == [
        "run: step 3/10",
        "run: step 6/10",
        "run: step 9/10",
        "run: step 10/10",  # the last step, at close
    ]
    # step 3: 1 step in 5 s; step 6: 3 steps (4..6) in 1.5 s since that line = 2 step/s,
    # 4 steps left = 0:02, 6.5 s since the start
    assert lines[0] == "run: step 3/10 (30%) loss=0.333 | 0.2 step/s, elapsed 0:05, ETA 0:35"
    assert lines[1] == "run: step 6/10 (60%) loss=0.167 | 2 step/s, elapsed 0:06, ETA 0:02"
    assert "ETA" not in lines[-1]


def test_lines_by_time_without_a_cadence_and_none_for_an_inner_loop(caplog):
    clock = _Clock()
    with caplog.at_level(logging.INFO):
        bar = LineProgress(total=100, desc="k-means", interval_s=30, clock=clock)
        for _ in range(100):  # 1 s per update: a line every 30 s
            clock.now += 1
            bar.update()
        bar.close()
        inner = LineProgress(total=5, desc="inner", leave=False, clock=clock)
        for _ in range(5):
            inner.update()
        inner.close()
    counts = [line.split(" (")[0].split()[-1] for line in _lines(caplog)]
    assert counts == ["30/100", "60/100", "90/100", "100/100"]


def test_progress_bar_wraps_iterables_in_every_mode(caplog):
    items = list(range(7))
    with caplog.at_level(logging.INFO):
        assert list(progress_bar(items, desc="lines", every=2, mode="lines")) == items
        assert list(progress_bar(items, desc="off", mode="off")) == items
        assert list(progress_bar(items, desc="disabled", mode="lines", enabled=False)) == items
    assert [line.split(" (")[0] for line in _lines(caplog)] == [
        "lines: it 2/7", "lines: it 4/7", "lines: it 6/7", "lines: it 7/7",
    ]  # fmt: skip


def test_bar_routes_log_records_around_itself_while_open(monkeypatch):
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)  # what logging.basicConfig installs
    monkeypatch.setattr(root, "handlers", [handler])
    outer = progress_bar(total=3, desc="outer", mode="bar")
    inner = progress_bar(total=3, desc="inner", mode="bar", leave=False)
    assert isinstance(outer, tqdm) and not outer.disable
    assert root.handlers != [handler]  # records go through tqdm.write now
    inner.close()
    assert root.handlers != [handler]  # the outer bar is still drawn
    outer.close()
    assert root.handlers == [handler]
