"""Checkpoint files: the newest readable one is used, broken ones are named, nothing is left
behind, and files are written with the permissions of any other file the user writes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
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


def _write_sharded(ckpt_dir: Path, step: int, keep: int = 0) -> Path:
    """A sharded checkpoint of one process, as an FSDP run of one rank writes it."""
    state = {"model": {"w": torch.full((300,), float(step)), "scale": torch.tensor(2.0)},
             "optimizer": {"state": {"w": {"exp_avg": torch.ones(300)}}}}  # fmt: skip
    return checkpoint.write_sharded(ckpt_dir, step, state=state, config={"seed": 0}, keep=keep,
                                    extra={"note": "x"})  # fmt: skip


def test_a_sharded_checkpoint_is_read_whole_in_one_process_and_pruned_like_files(tmp_path):
    ckpt_dir = tmp_path / "run" / "checkpoints"
    _write(ckpt_dir, 2)
    for step in (3, 6):
        _write_sharded(ckpt_dir, step, keep=2)
    assert sorted(os.listdir(ckpt_dir)) == ["step_00000003.dcp", "step_00000006.dcp"]
    ck = checkpoint.read(tmp_path / "run")
    assert ck.sharded and ck.step == 6 and ck.extra == {"note": "x"} and ck.optimizer is None
    assert ck.model.keys() == {"w", "scale"}  # the model's tensors only, not the optimiser's
    assert torch.equal(ck.model["w"], torch.full((300,), 6.0)) and ck.model["scale"] == 2.0
    assert checkpoint.read(ckpt_dir / "step_00000003.dcp").model["w"][0] == 3.0
    assert checkpoint.read(ckpt_dir, weights=False).model == {}  # a resuming trainer's read
    # DCP fills a live state (sharded under FSDP; here whole) in place
    state = {"model": {"w": torch.zeros(300), "scale": torch.tensor(0.0)}}
    checkpoint.load_sharded(ckpt_dir / "step_00000003.dcp", state)
    assert state["model"]["w"][0] == 3.0 and state["model"]["scale"] == 2.0


@pytest.mark.parametrize("damage", ["no shard", "truncated shard", "no index", "garbage meta"])
def test_a_broken_sharded_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, damage):
    ckpt_dir = tmp_path / "checkpoints"
    _write_sharded(ckpt_dir, 3)
    newest = _write_sharded(ckpt_dir, 6)
    shard = next(newest.glob("*.distcp"))
    if damage == "no shard":
        shard.unlink()
    elif damage == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "no index":
        (newest / ".metadata").unlink()
    else:
        (newest / "meta.pt").write_bytes(b"\x00not a zip" * 50)
    for weights in (True, False):  # False: the checks a resuming trainer relies on
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert checkpoint.read(ckpt_dir, weights=weights).step == 3
        assert "step_00000006.dcp: cannot read this checkpoint" in caplog.text
    with pytest.raises(ValueError, match="step_00000006.dcp: cannot read this checkpoint"):
        checkpoint.read(newest)  # named explicitly: no fallback


def test_garbled_shard_data_are_found_when_loaded(tmp_path):
    newest = _write_sharded(tmp_path, 6)
    shard = next(newest.glob("*.distcp"))
    size = shard.stat().st_size
    # garbled bytes fail in many ways (a bad pickle opcode, an index out of range, a huge
    # length: about 1 in 10 was not reported as damaged data before); every one is named
    for seed in range(20):
        shard.write_bytes(np.random.default_rng(seed).bytes(size))  # the size checks pass
        with pytest.raises(ValueError, match=r"step_00000006.dcp: cannot read this checkpoint "
                           r"\(damaged data: "):  # fmt: skip
            checkpoint.read(newest)
        with pytest.raises(checkpoint.BrokenCheckpoint, match=r"checkpoint \(damaged data: "):
            checkpoint.load_sharded(newest, {"model": {"w": torch.zeros(300)}})


def test_temporary_folders_of_killed_sharded_writes_are_removed(tmp_path):
    _write_sharded(tmp_path, 3)
    (tmp_path / ".step_00000006.dcp.tmp").mkdir()
    (tmp_path / ".step_00000006.dcp.tmp" / "__0_0.distcp").write_bytes(b"half")
    assert [p.name for p in checkpoint.remove_temporaries(tmp_path)] == [".step_00000006.dcp.tmp"]
    assert os.listdir(tmp_path) == ["step_00000003.dcp"]
