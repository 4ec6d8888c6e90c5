"""``mmptm pretrain`` and ``finetune`` through the command line: toyworld → tokenizer →
pretrain → eval retrieval, DDP; a bad recipe, output folder or data set is one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, cli_error, tiny_overrides

from mmptm.cli import main

PY = sys.executable


def mmptm(*args: str, timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [PY, "-m", "mmptm.cli", *args],
        capture_output=True, text=True, timeout=timeout, cwd=kw.get("cwd", ROOT), env=env,
    )  # fmt: skip


@pytest.mark.slow
def test_toyworld_tokenizer_pretrain_eval_end_to_end(tmp_path):
    world = tmp_path / "tw"
    r = mmptm("data", "toyworld", "--out", str(world), "--n-train", "64", "--n-val", "16",
              "--n-test", "16", "--image-size", "32", "--shard-size", "16")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads((world / "manifest.json").read_text())["counts"]["test"] == 16
    r = mmptm("tokenizer", "train", "--input", str(world / "image_text"), "--out",
              str(world / "tokenizer"), "--vocab-size", "300")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = tmp_path / "run"
    r = mmptm("pretrain", "clip_tiny", *tiny_overrides(world, run))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 6
    r = mmptm("eval", "retrieval", str(run), "--split", "test", "--out", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    assert "i2t_R@1" in r.stdout and "t2i_R@10" in r.stdout
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["n"] == 16 and result["chance_R@1"] == pytest.approx(1 / 16)
    for k in (1, 5, 10):
        assert 0.0 <= result[f"i2t_R@{k}"] <= result.get(f"i2t_R@{k * 2}", 1.0) <= 1.0


def test_bad_config_key_is_one_clear_line(tmp_path):
    r = mmptm("pretrain", "clip_tiny", "train.max_step=3",
              f"output_dir={tmp_path}/x")  # fmt: skip
    assert r.returncode == 2
    assert "train.max_step" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()


def test_missing_config_file_is_named(tmp_path):
    r = mmptm("pretrain", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "nope.yaml" in r.stderr


def test_unwritable_output_dir_is_one_line_before_training(tiny_world, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    over = [*tiny_overrides(tiny_world, blocker / "run")]
    line = cli_error(capsys, ["pretrain", "clip_tiny", *over])
    assert f"output_dir {blocker / 'run'} is not writable" in line
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        over = [*tiny_overrides(tiny_world, locked / "run")]
        line = cli_error(capsys, ["pretrain", "clip_tiny", *over])
        assert "is not writable" in line and "Permission denied" in line


def test_shards_none_of_which_is_readable_are_one_line(tiny_world, tmp_path, capsys):
    for i in range(2):
        (tmp_path / f"bad-{i}.tar").write_bytes(os.urandom(3000))
    over = [*tiny_overrides(tiny_world, tmp_path / "run"), f"data.train={tmp_path}/bad-*.tar"]
    line = cli_error(capsys, ["pretrain", "clip_tiny", *over])
    assert "no batch" in line and "2 bad samples were skipped" in line
    with pytest.raises(ValueError, match="no batch"):  # --debug: the traceback
        main(["--debug", "pretrain", "clip_tiny", *over])


def test_the_readme_session_stops_and_resumes(tiny_world, tmp_path, capsys, caplog):
    """README, Command line: a run started with overrides continues with the same command
    and resume=true; leaving one out that changes the schedule is refused with what to type."""
    run = tmp_path / "clip"
    base = [*tiny_overrides(tiny_world, run)]  # (they set train.max_steps=6)
    first = ["pretrain", "clip_tiny", *base, "train.max_steps=4"]
    assert main([*first, "train.stop_at=2"]) == 0  # interrupted at step 2
    line = cli_error(capsys, ["pretrain", "clip_tiny", *base, "resume=true"])
    assert "train.max_steps=4" in line and "repeat the overrides" in line
    assert main([*first, "train.lr=1e-4", "resume=true"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 4
    assert "train.lr: 0.001 -> 0.0001" in caplog.text  # other changes are named


@pytest.mark.slow
def test_two_process_ddp_on_cpu(tiny_world, tmp_path):
    run = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run(
        [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "mmptm.cli", "pretrain", "clip_tiny",
         *tiny_overrides(tiny_world, run), "train.max_steps=4", "train.ckpt_every=2"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    state = torch.load(run / "checkpoints" / "step_00000004.pt", weights_only=False)
    assert state["world_size"] == 2
    assert [s["rank"] for s in state["ranks"]] == [0, 1]
    # Each rank read 4 batches of 8 from its own half of the shards (96 samples, 6 shards).
    assert [sum(s["data"]["consumed"]) for s in state["ranks"]] == [4, 4]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # only rank 0 writes
    # Both ranks print their last metrics: different data, so different losses; DDP-averaged
    # gradients, so the same gradient norm.
    # (the two processes share one stdout pipe, so their lines may interleave: decode each
    # object where it starts)
    decoder = json.JSONDecoder()
    starts = [m.start() for m in re.finditer(r'\{"step": 4,', r.stdout)]
    last = [decoder.raw_decode(r.stdout, i)[0] for i in starts]
    assert len(last) == 2
    assert last[0]["loss"] != last[1]["loss"]
    assert last[0]["grad_norm"] == pytest.approx(last[1]["grad_norm"], rel=1e-5)
