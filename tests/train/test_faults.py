"""The fault suite: what users do to runs — kill them, break their files, fill the disk,
feed them broken data or NaN losses — and what they get: an exact resume or one clear line
(exit status 2). Distributed faults (uneven shards, a stalled rank) are in
``test_distributed.py``."""

from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, TEXT_MLM, cli_error, text_mlm_overrides, tiny_overrides
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mmptm.cli import main
from mmptm.models import checkpoint
from mmptm.models.pretrain import PretrainModel, PretrainOutput

CLIP = "configs/pretrain/clip_tiny.yaml"


def test_full_disk_is_one_line_and_keeps_the_last_checkpoint(
    tiny_world, tmp_path, capsys, monkeypatch
):
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("step") == 6:
            f.write(b"the first bytes")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    run = tmp_path / "run"
    line = cli_error(capsys, ["pretrain", TEXT_MLM, *text_mlm_overrides(tiny_world, run)])
    assert "No space left on device" in line and "step_00000003.pt is kept" in line
    assert os.listdir(run / "checkpoints") == ["step_00000003.pt"]  # no temporary file
    assert checkpoint.read(run).step == 3


def _rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_nan_loss_is_skipped_up_to_the_limit_then_stops(
    tiny_world, tmp_path, capsys, monkeypatch, caplog
):
    calls = itertools.count(1)
    real_forward = PretrainModel.forward

    def poisoned(self, batch):  # forward calls 2 and 4 (steps 2 and 3) give NaN
        out = real_forward(self, batch)
        if next(calls) not in (2, 4):
            return out
        terms = {**out.terms, "contrastive_loss": out.terms["contrastive_loss"] * float("nan")}
        return PretrainOutput(out.loss * float("nan"), terms)

    monkeypatch.setattr(PretrainModel, "forward", poisoned)
    run = tmp_path / "run"
    argv = ["pretrain", CLIP, *tiny_overrides(tiny_world, run), "train.max_nonfinite_steps=1"]
    with caplog.at_level(logging.WARNING):
        line = cli_error(capsys, argv)
    keys = r"\(batch keys: train\d+, train\d+"
    assert re.search(r"non-finite loss at step 2: contrastive_loss=nan " + keys, caplog.text)
    assert "step skipped, no update (1 of train.max_nonfinite_steps=1)" in caplog.text
    assert re.search(r"non-finite loss at step 3: contrastive_loss=nan " + keys, line)
    assert [r["step"] for r in _rows(run)] == [1, 2]  # the skipped batch left no row
    assert _rows(run)[-1]["nonfinite_skipped"] == 1


#: runs ``mmptm ARGV`` and kills itself with SIGKILL at a chosen point: ``step5`` as step 5
#: begins (steps 4 and 5 are past the checkpoint of step 3), ``write6`` half way through
#: writing the checkpoint of step 6
KILLER = """
import os, signal, sys
import torch
from mmptm.cli import main
from mmptm.train.trainer import Trainer

where, argv = sys.argv[1], sys.argv[2:]
real_step, real_save = Trainer.train_step, torch.save

def train_step(self, batches):
    if where == "step5" and self.step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_step(self, batches)

def save(obj, f, *args, **kwargs):
    if where == "write6" and isinstance(obj, dict) and obj.get("step") == 6:
        f.write(b"PK half a checkpoint")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *args, **kwargs)

Trainer.train_step, torch.save = train_step, save
sys.exit(main(argv))
"""


def _losses(run) -> dict[int, dict[str, float]]:
    return {r["step"]: {k: v for k, v in r.items() if k.endswith("loss")} for r in _rows(run)}


@pytest.fixture(scope="module")
def uninterrupted(tiny_world, tmp_path_factory):
    run = tmp_path_factory.mktemp("faults") / "full"
    assert main(["pretrain", TEXT_MLM, *text_mlm_overrides(tiny_world, run)]) == 0
    return run


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "parallel"), [("step5", "ddp"), ("write6", "ddp"), ("write6", "fsdp")]
)
def test_kill_9_then_resume_reaches_the_uninterrupted_losses(
    tiny_world, tmp_path, uninterrupted, where, parallel
):
    # fsdp: one process holds the whole model (the same steps) but writes sharded checkpoints,
    # killed after DCP wrote the shards, as rank 0 writes meta.pt before the rename
    run = tmp_path / "run"
    argv = [
        "pretrain",
        TEXT_MLM,
        *text_mlm_overrides(tiny_world, run),
        f"train.parallel={parallel}",
    ]
    killed = subprocess.run([sys.executable, "-c", KILLER, where, *argv], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    logged = {"step5": [1, 2, 3, 4], "write6": [1, 2, 3, 4, 5, 6]}[where]
    assert [r["step"] for r in _rows(run)] == logged
    if where == "write6":  # the killed write left its temporary file, not a step_6 file
        names = os.listdir(run / "checkpoints")
        assert not [n for n in names if n.startswith("step_00000006")]
        assert any(n.startswith(".step_00000006") and n.endswith(".tmp") for n in names)
    assert main([*argv, "resume=true"]) == 0  # from step 3
    assert [r["step"] for r in _rows(run)] == [1, 2, 3, 4, 5, 6]  # each step once
    board = EventAccumulator(str(run))  # TensorBoard too (it hides the killed run's 4..)
    board.Reload()
    assert [e.step for e in board.Scalars("loss/loss")] == [1, 2, 3, 4, 5, 6]
    assert _losses(run) == _losses(uninterrupted)
    a, b = checkpoint.read(run).model, checkpoint.read(uninterrupted).model
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    assert not [p for p in run.rglob("*.tmp")]


@pytest.mark.parametrize(
    ("damage", "parallel"), [("truncated", "ddp"), ("garbage", "ddp"), ("garbage", "fsdp")]
)
def test_broken_newest_checkpoint_resumes_from_the_one_before(
    tiny_world, tmp_path, uninterrupted, caplog, damage, parallel
):
    run = tmp_path / "run"
    argv = [
        "pretrain",
        TEXT_MLM,
        *text_mlm_overrides(tiny_world, run),
        f"train.parallel={parallel}",
    ]
    assert main(argv) == 0
    kind = "dcp" if parallel == "fsdp" else "pt"
    newest = run / "checkpoints" / f"step_00000006.{kind}"
    if parallel == "fsdp":  # shard data of the right size: found only when loaded
        newest = next(newest.glob("*.distcp"))
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 3] if damage == "truncated" else os.urandom(len(data)))
    with caplog.at_level(logging.WARNING):
        assert main([*argv, "resume=true"]) == 0
    assert re.search(
        rf"step_00000006.{kind}: cannot read this checkpoint .*step_00000003.{kind}", caplog.text
    )
    assert _losses(run) == _losses(uninterrupted)
    assert checkpoint.read(run).step == 6  # written again, whole
