"""FSDP (train.parallel=fsdp) with real processes (gloo, 2 ranks on CPU): the same steps as
one process and as DDP, sharded checkpoints that resume at another number of ranks, a
killed checkpoint write, two "nodes" under torchrun. Activation checkpointing and the FLOP
count need no processes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import (
    ROOT,
    TEXT_MLM,
    free_port,
    rank_env,
    spawn_ranks,
    text_mlm_overrides,
    tiny_overrides,
)

from mmptm.data.pipeline import Loader
from mmptm.models import checkpoint
from mmptm.recipe import load_run_config
from mmptm.train.trainer import leave_process_group

CLIP = "clip_tiny"
needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo"
)

#: clip_tiny with a one-block ViT (no BatchNorm: its statistics depend on how a batch is
#: split) and clipping that acts; micro-batches of 4 rows, 2 per step
VIT = [
    "model.encoders.image.backbone.model_name=vit_tiny_patch16_224",
    "model.encoders.image.backbone.model_kwargs={img_size: 32, patch_size: 8, embed_dim: 32, "
    "depth: 1, num_heads: 2}",
    "data.batch_size=4",
    "train.grad_accum=2",
    "train.clip_grad_norm=0.01",
    "train.lr=0.002",
]


def _rows(batch: dict, part: int, parts: int) -> dict:
    """Rows ``part`` of ``parts`` equal slices of a collated batch."""
    n = len(batch["__key__"])
    s = slice(part * n // parts, (part + 1) * n // parts)
    return {k: v[s] if isinstance(v, torch.Tensor | list) and len(v) == n else v
            for k, v in batch.items()}  # fmt: skip


def _full_state(trainer) -> tuple[dict, dict]:
    """The whole model and optimiser state (names as keys), gathered from every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_state_dict(trainer.model, trainer.optimizer, options=opts)


def _parity_ranks(rank: int, port: int, overrides: list, batches_path: str, out: str) -> None:
    """Each rank trains on its half of every micro-batch, under FSDP, then DDP."""
    rank_env(rank, port)
    from mmptm.train.trainer import Trainer

    batches = torch.load(batches_path, weights_only=False)
    result = {}
    ok = False
    try:
        for mode in ("fsdp", "ddp"):
            run = f"{out}/{mode}"
            cfg = load_run_config(CLIP, [*overrides, f"output_dir={run}", f"train.parallel={mode}"])
            trainer = Trainer(cfg)
            trainer.loader = Loader(trainer.stream, 0)  # for the data position save() records
            terms = []
            for step in batches:
                terms.append(trainer.train_step(iter([_rows(m, rank, 2) for m in step])))
            trainer.save()
            model, optimizer = _full_state(trainer)
            result[mode] = {"terms": terms, "model": model, "optimizer": optimizer}
        torch.save(result, Path(out) / f"rank{rank}.pt")
        ok = True
    finally:
        leave_process_group(wait=ok)


def _close(a: dict, b: dict, rtol: float, atol: float, what: str) -> None:
    assert a.keys() == b.keys(), what
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=f"{what}: {k}")


@pytest.mark.slow
@needs_gloo
def test_fsdp_and_ddp_on_two_ranks_take_the_steps_of_one_process(tiny_world, tmp_path):
    from mmptm.train.trainer import Trainer

    overrides = [*tiny_overrides(tiny_world, tmp_path / "one"), *VIT]
    one = Trainer(load_run_config(CLIP, overrides))
    loader = iter(Loader(one.stream, 0))
    batches = [[next(loader), next(loader)] for _ in range(3)]  # 3 steps, 2 micro-batches
    torch.save(batches, tmp_path / "batches.pt")
    out = tmp_path / "ranks"
    out.mkdir()
    spawn_ranks(_parity_ranks, (free_port(), overrides, str(tmp_path / "batches.pt"), str(out)),
                deadline_s=240)  # fmt: skip
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]

    # one process: micro-batch m of a step is rank 0's half of it, then rank 1's
    reference = [one.train_step(iter(step)) for step in batches]
    ref_model, ref_optimizer = _full_state(one)
    for mode in ("fsdp", "ddp"):
        for step, ref in enumerate(reference):
            r0, r1 = (r[mode]["terms"][step] for r in ranks)
            # each rank logs the loss of its rows; the global loss is their mean
            for k in ("loss", "contrastive_loss"):
                assert (r0[k] + r1[k]) / 2 == pytest.approx(ref[k], rel=1e-6), (mode, step, k)
            # clipping saw the global gradient norm (the sharded and whole parameters'); its
            # sums over 2 micro-batches and 2 ranks round differently: 6e-6 seen
            assert r0["grad_norm"] == pytest.approx(ref["grad_norm"], rel=2e-5), (mode, step)
            assert ref["grad_norm"] > 0.01  # clipping acted
        model, optimizer = ranks[0][mode]["model"], ranks[0][mode]["optimizer"]
        # Adam turns the rounding differences of tiny gradients into steps of up to lr (the
        # keys' biases have none: softmax ignores them): 1e-6 seen, 1/1000 of lr x 3 steps
        _close(model, ref_model, rtol=0, atol=6e-6, what=f"{mode} weights")
        assert optimizer["param_groups"] == ref_optimizer["param_groups"]
        for name, state in ref_optimizer["state"].items():
            _close(optimizer["state"][name], state, rtol=1e-4, atol=1e-7, what=f"{mode} {name}")
    # the sharded checkpoint, read in this one process, holds the FSDP run's whole model
    ck = checkpoint.read(out / "fsdp")
    assert ck.path.name == "step_00000003.dcp" and ck.world_size == 2 and ck.step == 3
    _close(ck.model, ranks[0]["fsdp"]["model"], rtol=0, atol=0, what="checkpoint.read")


def _phase(overrides: list, oracle: str) -> None:
    """Resume a run and train it on; ``oracle``.restored.pt / .pt: the whole model and
    optimiser state right after the restore, and at the end (written by rank 0)."""
    from mmptm.train.trainer import Trainer

    trainer = Trainer(load_run_config(CLIP, overrides))
    real_restore = trainer.restore
    main = not dist.is_initialized() or dist.get_rank() == 0

    def restore(ckpt):
        real_restore(ckpt)
        state = _full_state(trainer)
        if main:
            torch.save(state, f"{oracle}.restored.pt")

    trainer.restore = restore
    trainer.fit()
    state = _full_state(trainer)
    if main:
        torch.save(state, f"{oracle}.pt")


def _phases_ranks(rank: int, port: int, phases: list) -> None:
    rank_env(rank, port)
    ok = False
    try:
        for overrides, oracle in phases:
            _phase(overrides, oracle)
        ok = True
    finally:
        leave_process_group(wait=ok)


def _same_state(a: tuple, b: tuple, what: str) -> None:
    (model_a, optim_a), (model_b, optim_b) = a, b
    _close(model_a, model_b, rtol=0, atol=0, what=f"{what} model")
    # DCP gives tuples (Adam's betas) back as lists
    groups_a, groups_b = (json.dumps(o["param_groups"]) for o in (optim_a, optim_b))
    assert groups_a == groups_b, what
    assert optim_a["state"].keys() == optim_b["state"].keys(), what
    for name, state in optim_a["state"].items():
        _close(state, optim_b["state"][name], rtol=0, atol=0, what=f"{what} {name}")


@pytest.mark.slow
@needs_gloo
def test_checkpoints_move_between_ddp_fsdp_and_numbers_of_ranks(tiny_world, tmp_path, caplog):
    """2 ranks DDP (.pt) -> 2 ranks FSDP (.dcp) -> 1 process -> 2 ranks FSDP -> 2 ranks DDP,
    3 steps each: every resume restores the model and optimiser exactly."""
    run = tmp_path / "run"
    base = [*tiny_overrides(tiny_world, run), *VIT, "train.grad_accum=1", "train.max_steps=15",
            "resume=true"]  # fmt: skip
    phases = [
        ([*base, "train.parallel=ddp", "train.stop_at=3"], str(tmp_path / "p1")),
        ([*base, "train.parallel=fsdp", "train.stop_at=6"], str(tmp_path / "p2")),
        ([*base, "train.parallel=fsdp", "train.stop_at=9"], str(tmp_path / "p3")),
        ([*base, "train.parallel=fsdp", "train.stop_at=12"], str(tmp_path / "p4")),
        ([*base, "train.parallel=ddp"], str(tmp_path / "p5")),
    ]
    spawn_ranks(_phases_ranks, (free_port(), phases[:2]), deadline_s=240)
    assert checkpoint.read(run, weights=False).path.name == "step_00000006.dcp"
    with caplog.at_level(logging.WARNING):
        _phase(*phases[2])  # this process alone
    assert "written by 2 ranks, this run has 1" in caplog.text
    spawn_ranks(_phases_ranks, (free_port(), phases[3:]), deadline_s=240)

    def state(name: str) -> tuple:
        return torch.load(tmp_path / f"{name}.pt", weights_only=False)

    for before, after in [("p1", "p2"), ("p2", "p3"), ("p3", "p4"), ("p4", "p5")]:
        _same_state(state(f"{after}.restored"), state(before), f"{before} -> {after}")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 16))
    # 12 steps of 2 x 4 samples a 96-sample epoch: 2 ranks stop mid-epoch 0 at step 6; one
    # process goes on with epoch 1 (24 steps), stops in it at 9; 2 ranks go on with epoch 2
    epochs = {r["step"]: r["epoch"] for r in rows}
    assert [epochs[s] for s in (6, 7, 9, 10)] == [0, 1, 1, 2]
    assert [p.name for p in checkpoint.list_checkpoints(run / "checkpoints")] == [
        "step_00000012.dcp", "step_00000015.pt"]  # fmt: skip
    # a sharded checkpoint of a 2-rank run read whole in one process: as the live model was
    _close(checkpoint.read(run / "checkpoints" / "step_00000012.dcp").model, state("p4")[0],
           rtol=0, atol=0, what="checkpoint.read")  # fmt: skip


@pytest.mark.slow
@needs_gloo
def test_two_nodes_under_torchrun_train_to_the_end(tiny_world, tmp_path):
    """``torchrun --nnodes=2`` twice on 127.0.0.1, one rank a "node", as on two machines."""
    run = tmp_path / "run"
    port = free_port()
    argv = ["pretrain", TEXT_MLM, *text_mlm_overrides(tiny_world, run), "train.parallel=fsdp",
            "train.dist_timeout_s=120"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                "--master_addr=127.0.0.1", f"--master_port={port}"]  # fmt: skip
    nodes = [
        subprocess.Popen(
            [*torchrun, f"--node_rank={rank}", "-m", "mmptm.cli", *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        logs = [node.communicate(timeout=240)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    ck = checkpoint.read(run)
    assert ck.path.name == "step_00000006.dcp" and ck.world_size == 2 and len(ck.ranks) == 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
