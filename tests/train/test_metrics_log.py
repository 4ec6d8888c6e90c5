"""What a run logs: TensorBoard event files beside metrics.jsonl (each step once, also across
resumes), and progress lines at ``train.log_every`` when stderr is not a terminal."""

from __future__ import annotations

import json
import logging
import sys
import time

import pytest
from conftest import TEXT_MLM, text_mlm_overrides
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from mmptm.recipe import load_run_config
from mmptm.train import metrics_log
from mmptm.train.trainer import pretrain

EXPECTED_TAGS = {
    "loss/loss", "loss/mlm_loss", "metric/mlm_acc", "optim/lr", "optim/grad_norm",
    "system/samples_per_s", "system/data_skipped", "system/nonfinite_skipped", "system/epoch",
    "system/flops_per_step",  # in a process's first row only
}  # fmt: skip


def _rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _board(run) -> EventAccumulator:
    acc = EventAccumulator(str(run))
    acc.Reload()
    return acc


def _scalars(run) -> dict[str, list[tuple[int, float]]]:
    acc = _board(run)
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def _purge_marks(run) -> list[list[int]]:
    """Per event file (oldest first): the steps of its 'restart here' marks."""
    marks = []
    for path in sorted(run.glob("events.out.tfevents.*")):
        events = EventFileLoader(str(path)).Load()
        marks.append([e.step for e in events if e.HasField("session_log")])
    return marks


def test_event_files_hold_every_row_value_and_the_config(tiny_world, tmp_path):
    run = tmp_path / "run"
    pretrain(load_run_config(TEXT_MLM, text_mlm_overrides(tiny_world, run)))
    scalars = _scalars(run)
    assert set(scalars) == EXPECTED_TAGS
    rows = _rows(run)
    for tag, points in scalars.items():
        key = tag.split("/", 1)[1]
        logged = [r for r in rows if key in r]
        steps = [1] if key == "flops_per_step" else [1, 2, 3, 4, 5, 6]
        assert [s for s, _ in points] == [r["step"] for r in logged] == steps, tag
        for (_, value), row in zip(points, logged):  # stored as float32
            assert value == pytest.approx(row[key], rel=1e-6), (tag, row["step"])
    texts = _board(run).Tensors("config/text_summary")
    assert [t.step for t in texts] == [0]
    shown = texts[0].tensor_proto.string_val[0].decode()
    assert "max_steps: 6" in shown and f"output_dir: {run}" in shown


def test_resume_shows_each_step_once(tiny_world, tmp_path):
    run = tmp_path / "run"
    over = text_mlm_overrides(tiny_world, run)  # 6 steps, a checkpoint every 3
    pretrain(load_run_config(TEXT_MLM, over))
    first = _scalars(run)
    # killed after logging steps 4..6 but before the checkpoint of step 6 landed
    (run / "checkpoints" / "step_00000006.pt").unlink()
    pretrain(load_run_config(TEXT_MLM, [*over, "resume=true"]))  # from step 3
    # the resumed session's file starts with a mark that hides the old steps 4.. (TensorBoard
    # and its fast loader both honour it)
    assert _purge_marks(run) == [[0], [4]]
    again = _scalars(run)
    assert [s for s, _ in again["loss/loss"]] == [1, 2, 3, 4, 5, 6]
    assert again["loss/mlm_loss"] == first["loss/mlm_loss"]  # an exact resume
    assert len(_board(run).Tensors("config/text_summary")) == 1  # the fresh run's only


def test_a_fresh_run_hides_the_events_of_an_earlier_one(tiny_world, tmp_path):
    run = tmp_path / "run"
    over = text_mlm_overrides(tiny_world, run)
    pretrain(load_run_config(TEXT_MLM, over))
    for ckpt in (run / "checkpoints").iterdir():  # start over in the same folder
        ckpt.unlink()
    pretrain(load_run_config(TEXT_MLM, [*over, "train.max_steps=2"]))
    assert _purge_marks(run) == [[0], [0]]
    assert [s for s, _ in _scalars(run)["loss/loss"]] == [1, 2]
    assert [r["step"] for r in _rows(run)] == [1, 2]


def test_no_event_files_when_switched_off_or_missing(tiny_world, tmp_path, monkeypatch, caplog):
    off = tmp_path / "off"
    short = ["train.max_steps=2"]
    pretrain(load_run_config(TEXT_MLM, [*text_mlm_overrides(tiny_world, off), *short,
                                        "train.tensorboard=false"]))  # fmt: skip
    assert not list(off.glob("events.*")) and len(_rows(off)) == 2
    # without the tensorboard package: one warning, and training goes on
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    metrics_log._summary_writer_class.cache_clear()
    try:
        with caplog.at_level(logging.WARNING):
            for name in ("a", "b"):
                run = tmp_path / name
                pretrain(load_run_config(TEXT_MLM, [*text_mlm_overrides(tiny_world, run), *short]))
                assert not list(run.glob("events.*")) and len(_rows(run)) == 2
    finally:
        metrics_log._summary_writer_class.cache_clear()
    warnings = [r.getMessage() for r in caplog.records if "train.tensorboard" in r.getMessage()]
    assert len(warnings) == 1 and "metrics go to metrics.jsonl only" in warnings[0]


def test_progress_lines_at_log_every_without_a_terminal(tiny_world, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MMPTM_PROGRESS", "auto")  # stderr is captured: not a terminal
    run = tmp_path / "run"
    over = [*text_mlm_overrides(tiny_world, run), "train.progress=true", "train.log_every=2",
            "train.max_steps=7"]  # fmt: skip
    with caplog.at_level(logging.INFO, logger="mmptm.progress"):
        pretrain(load_run_config(TEXT_MLM, over))
    lines = [r.getMessage() for r in caplog.records if r.name == "mmptm.progress"]
    assert [line.split(" (")[0] for line in lines] == [
        "run: step 2/7", "run: step 4/7", "run: step 6/7", "run: step 7/7",
    ]  # fmt: skip
    rows = {r["step"]: r for r in _rows(run)}
    for line in lines:  # each line shows its step's loss, as logged
        step = int(line.split("/")[0].split()[-1])
        assert f"loss={rows[step]['loss']:.4g} " in line
        assert "samples_per_s=" in line and "step/s, elapsed" in line
    assert "ETA" in lines[0] and "ETA" not in lines[-1]


def test_a_resumed_log_sorts_after_an_event_file_of_the_same_second(tmp_path):
    # TensorBoard reads event files in name order (second, host, process id): a resume in the
    # second the killed run's file was made, by a process whose name part sorts lower, must
    # still come after it, or TensorBoard reads its steps first and drops them as a restart
    first = metrics_log.MetricsLog(tmp_path, 0)
    for step in (1, 2, 3, 4):
        first.write({"step": step, "loss": float(step)})
    first.close()
    (old,) = tmp_path.glob("events.out.tfevents.*")
    late = tmp_path / f"events.out.tfevents.{int(time.time())}.zzzz-host.99999999.0"
    old.rename(late)  # as if written this very second by a process that sorts last
    resumed = metrics_log.MetricsLog(tmp_path, 3)
    for step in (4, 5, 6):
        resumed.write({"step": step, "loss": 10.0 * step})
    resumed.close()
    points = [(e.step, e.value) for e in _board(tmp_path).Scalars("loss/loss")]
    assert points == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)]
