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

import torch
from conftest import cli_error, tiny_overrides

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
    line = cli_error(capsys, ["pretrain", CLIP, *tiny_overrides(tiny_world, run)])
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
