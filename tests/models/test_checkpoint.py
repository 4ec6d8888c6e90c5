"""Checkpoint files: the newest readable one is used, broken ones are named, nothing is left
behind, and files are written with the permissions of any other file the user writes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from mmptm.models import checkpoint


def _write(ckpt_dir: Path, step: int) -> Path:
    return checkpoint.write(
        ckpt_dir, step, model={"w": torch.full((3,), float(step))}, config={"seed": 0}
    )


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_broken_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, damage):
    run = tmp_path / "run"
    _write(run / "checkpoints", 3)
    newest = _write(run / "checkpoints", 6)
    data = newest.read_bytes()
    newest.write_bytes(
        {"truncated": data[: len(data) // 2], "garbage": b"\x00not a zip" * 50, "empty": b""}[
            damage
        ]
    )
    with caplog.at_level(logging.WARNING):
        ck = checkpoint.read(run)
    assert ck.step == 3 and ck.model["w"][0].item() == 3.0
    assert "step_00000006.pt" in caplog.text and "step_00000003.pt" in caplog.text
    assert checkpoint.read(run / "checkpoints").step == 3  # the folder itself, too


def test_no_readable_checkpoint_is_one_error_naming_each_file(tmp_path):
    ckpt_dir = tmp_path / "checkpoints"
    for step in (3, 6):
        _write(ckpt_dir, step).write_bytes(b"broken")
    with pytest.raises(ValueError, match=r"no readable checkpoint.*step_00000006.*step_00000003"):
        checkpoint.read(ckpt_dir)


def test_a_broken_checkpoint_named_explicitly_is_an_error_not_a_fallback(tmp_path):
    ckpt_dir = tmp_path / "checkpoints"
    _write(ckpt_dir, 3)
    newest = _write(ckpt_dir, 6)
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"step_00000006.pt: cannot read this checkpoint"):
        checkpoint.read(newest)


def test_checkpoints_are_written_with_the_umask_and_leave_no_temporary(tmp_path):
    ckpt_dir = tmp_path / "checkpoints"
    old = os.umask(0o022)
    try:
        path = _write(ckpt_dir, 3)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o644  # was 0600: others could not read it
    assert [p.name for p in ckpt_dir.iterdir()] == ["step_00000003.pt"]
