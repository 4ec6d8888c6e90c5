"""The fault suite: what users do to runs — kill them, break their files, fill the disk,
feed them broken data or NaN losses — and what they get: an exact resume or one clear line
(exit status 2). Distributed faults (uneven shards, a stalled rank) are in
``test_distributed.py``."""

from __future__ import annotations

import errno
import os

import torch
from conftest import cli_error, tiny_overrides

from mmptm.models import checkpoint

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
