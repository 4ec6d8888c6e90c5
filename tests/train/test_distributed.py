"""DDP faults with real processes (gloo, 2 ranks on CPU): shards that do not split evenly,
bad samples on every rank, a stalled rank. Every spawned run has a deadline, and ranks meet
at a barrier before tearing gloo down (one that left first aborted the other under load)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import (
    ROOT,
    TEXT_MLM,
    WORLD,
    free_port,
    rank_env,
    read_shard_samples,
    spawn_ranks,
    text_mlm_overrides,
)

from mmptm.data.shards import ShardWriter
from mmptm.train.trainer import leave_process_group

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo"),
]


def _record_runs(rank: int, port: int, runs: dict, out_dir: str) -> None:
    """Train each run; save per step the batch's sample keys and the data epoch, and the
    error that stopped it. ``runs``: name → (recipe, overrides, forward calls of rank 1
    that give a NaN loss)."""
    rank_env(rank, port)
    from mmptm.models.pretrain import PretrainModel, PretrainOutput
    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import NonFiniteLoss, Trainer

    keys: list[list[str]] = []
    epochs: list[int] = []
    nan_calls: set[int] = set()
    real_forward, real_step = PretrainModel.forward, Trainer.train_step

    def forward(self, batch):
        keys.append(list(batch["__key__"]))
        out = real_forward(self, batch)
        if rank == 1 and len(keys) in nan_calls:
            return PretrainOutput(out.loss * float("nan"), out.terms)
        return out

    def train_step(self, batches):
        terms = real_step(self, batches)
        epochs.append(self.loader.state.epoch)
        return terms

    PretrainModel.forward, Trainer.train_step = forward, train_step
    result = {}
    ok = False
    try:
        for name, (recipe, overrides, nans) in runs.items():
            keys.clear()
            epochs.clear()
            nan_calls.clear()
            nan_calls.update(nans)
            error = ""
            try:
                Trainer(load_run_config(recipe, overrides)).fit()
            except NonFiniteLoss as e:
                error = str(e)
            result[name] = {"keys": list(keys), "epochs": list(epochs), "error": error}
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
        ok = True
    finally:
        leave_process_group(wait=ok)


def _shards(folder: Path, samples: list, sizes: list[int], bad_first: bool = False) -> str:
    """Shards of the given sizes from toyworld samples; ``bad_first``: each starts with a
    sample whose json is broken (skipped and counted)."""
    folder.mkdir()
    start = 0
    for n, size in enumerate(sizes):
        with ShardWriter(str(folder / f"{n}-%06d.tar"), size + 1) as w:
            if bad_first:
                w.write({"__key__": f"bad{n}", "txt": "x", "json": b"{broken"})
            for key, members in samples[start : start + size]:
                w.write({"__key__": key, **members})
        start += size
    return f"{folder}/*.tar"


def test_uneven_shards_give_every_rank_batches_and_no_sample_twice_per_epoch(tiny_world, tmp_path):
    samples = read_shard_samples(sorted(map(str, (tiny_world / "image_text").glob("train-*"))))
    common = [*text_mlm_overrides(tiny_world, tmp_path), "train.ckpt_every=100",
              "train.dist_timeout_s=60"]  # fmt: skip
    runs = {
        # one shard, 2 ranks x 2 workers: 8 samples a rank, one batch of 8 (was: no batch)
        "one": (_shards(tmp_path / "one", samples, [16]), 8, 2, 3),
        # three shards: one each, the third shared (was: one rank 2 shards, the other 1)
        "three": (_shards(tmp_path / "three", samples, [16, 16, 16]), 4, 2, 13),
        # unequal shards, a bad sample in each: epochs end with the short rank
        "unequal": (_shards(tmp_path / "unequal", samples, [16, 6], bad_first=True), 4, 0, 4),
    }
    args = {
        name: (TEXT_MLM, [*common, f"data.train={spec}", f"data.batch_size={batch}",
               f"data.num_workers={workers}", f"train.max_steps={steps}",
               f"output_dir={tmp_path / 'runs' / name}"]
               + (["data.shuffle_buffer=1"] if name == "unequal" else []), ())
        for name, (spec, batch, workers, steps) in runs.items()
    }  # fmt: skip
    # rank 1 alone has NaN losses in its 2nd and 4th batch: one step skipped, then all stop
    args["nan"] = (TEXT_MLM, [*common, f"output_dir={tmp_path / 'runs' / 'nan'}",
                              "train.max_nonfinite_steps=1"], (2, 4))  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    spawn_ranks(_record_runs, (free_port(), args, str(out)), deadline_s=240)
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]
    for name, (_, _, _, steps) in runs.items():
        epochs = ranks[0][name]["epochs"]
        assert len(epochs) == steps, name
        assert epochs == ranks[1][name]["epochs"], f"{name}: ranks in different epochs"
        for epoch in set(epochs):
            keys = [k for r in ranks for e, batch in zip(r[name]["epochs"], r[name]["keys"])
                    if e == epoch for k in batch]  # fmt: skip
            assert len(keys) == len(set(keys)), f"{name}: a sample read twice in epoch {epoch}"
    assert ranks[0]["one"]["epochs"] == [0, 1, 2]  # one batch per rank and epoch
    assert ranks[0]["three"]["epochs"] == [0] * 6 + [1] * 6 + [2]  # 24 samples a rank
    assert ranks[0]["unequal"]["epochs"] == [0, 1, 2, 3]  # 5 good samples: one batch
    # every rank's bad sample counts (was: rank 0's only), and across epochs
    rows = (tmp_path / "runs" / "unequal" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["data_skipped"] for r in rows] == [2, 4, 6, 8]
    # a NaN on one rank: every rank skips the same step, then every rank stops with its report
    nan = [r["nan"] for r in ranks]
    assert len(nan[0]["epochs"]) == len(nan[1]["epochs"]) == 3  # step 1, skipped, step 2
    assert nan[0]["error"] == nan[1]["error"]
    assert re.match(r"non-finite loss at step 3: loss=nan \(rank 1, batch keys: ", nan[0]["error"])


def _stall_rank_1(rank: int, port: int, recipe: str, overrides: list, out_dir: str) -> None:
    """Rank 1 stops answering before step 3 (as if paused); rank 0 reports what it sees."""
    rank_env(rank, port)
    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import Trainer, pretrain

    real_step = Trainer.train_step

    def train_step(self, batches):
        if rank == 1 and self.step == 2:
            time.sleep(600)
        return real_step(self, batches)

    Trainer.train_step = train_step
    t0 = time.monotonic()
    try:
        pretrain(load_run_config(recipe, overrides))
        message = "finished"
    except Exception as e:
        message = f"{type(e).__name__}: {e}"
    (Path(out_dir) / f"rank{rank}.txt").write_text(f"{time.monotonic() - t0:.1f} {message}")


def test_a_stalled_rank_is_named_after_the_timeout(tiny_world, tmp_path):
    overrides = [*text_mlm_overrides(tiny_world, tmp_path / "run"), "train.dist_timeout_s=5"]
    out = tmp_path / "out"
    out.mkdir()
    report = out / "rank0.txt"
    spawn_ranks(_stall_rank_1, (free_port(), TEXT_MLM, overrides, str(out)), deadline_s=180,
           done=report.exists)  # fmt: skip
    seconds, message = report.read_text().split(" ", 1)
    assert message.startswith("RankStalled: rank 1 stopped answering at step 3: no reply within "
                              "train.dist_timeout_s=5"), message  # fmt: skip
    assert float(seconds) < 60  # the default would have waited 10 minutes


def _threads_around_pretrain(rank: int, port: int, overrides: list, out_dir: str) -> None:
    rank_env(rank, port)
    import threading

    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import pretrain

    def native_threads() -> list[str]:
        """This process's threads that Python did not start (gloo's among them): "id name"."""
        python = {t.native_id for t in threading.enumerate()}
        ids = [t for t in sorted(os.listdir("/proc/self/task")) if int(t) not in python]
        return [f"{t} {Path(f'/proc/self/task/{t}/comm').read_text().strip()}" for t in ids]

    before = native_threads()
    pretrain(load_run_config(TEXT_MLM, overrides))
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps([before, native_threads()]))


def test_pretrain_joins_the_process_group_threads_before_it_returns(tiny_world, tmp_path):
    """The trainer's reference cycles held the process group (through the DDP reducer) after
    ``destroy_process_group``, so gloo's threads lived on until a garbage collection, which
    could come at interpreter shutdown and abort a rank whose run had finished. (Under FSDP2
    torch itself keeps the group until the process ends: ranks leave by ``exit_rank``.)"""
    overrides = [*text_mlm_overrides(tiny_world, tmp_path / "run"), "train.max_steps=2"]
    out = tmp_path / "out"
    out.mkdir()
    spawn_ranks(_threads_around_pretrain, (free_port(), overrides, str(out)), deadline_s=180)
    for rank in range(2):
        before, after = json.loads((out / f"rank{rank}.json").read_text())
        assert set(after) <= set(before), f"rank {rank}: threads left {set(after) - set(before)}"


def test_exit_rank_flushes_output_and_skips_interpreter_shutdown(tmp_path):
    code = (
        "import atexit, sys\n"
        "from mmptm.train.trainer import exit_rank\n"
        "atexit.register(lambda: print('shutdown ran'))\n"
        "sys.stdout.write('buffered'); sys.stderr.write('err')\n"
        "exit_rank(3)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)  # fmt: skip
    assert (r.returncode, r.stdout, r.stderr) == (3, "buffered", "err")
