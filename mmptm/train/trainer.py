"""The pre-training loop: one process, or one per rank under ``torchrun`` (DDP or FSDP).

Writes ``<output_dir>/config.yaml`` (the resolved recipe), ``metrics.jsonl`` (one JSON row per
logged step) and TensorBoard event files beside it (``metrics_log.py``), and
``checkpoints/step_XXXXXXXX.pt`` (atomic; model, optimiser, scheduler, RNG and data position
of every rank; ``step_XXXXXXXX.dcp/`` with sharded files under FSDP), so that
``resume=true`` continues exactly.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import math
import os
import random
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.nn.parallel import DistributedDataParallel

from mmptm.batch import move_to, pick_device
from mmptm.config import save_config, to_dict
from mmptm.data.pipeline import DataState, Loader, stream_config
from mmptm.encoders.base import VocabInfo
from mmptm.eval.curves import METRICS_FILE
from mmptm.io import remove_temporaries
from mmptm.models import checkpoint
from mmptm.models.checkpoint import Checkpoint
from mmptm.models.load import NO_TEXT, build_model, encoder_prefixes, init_from, load_init
from mmptm.models.pretrain import PretrainModel, data_transforms
from mmptm.objectives.base import Objective
from mmptm.progress import progress_bar
from mmptm.recipe import RunConfig, check_recipe
from mmptm.train import flops, parallel
from mmptm.train.metrics_log import MetricsLog
from mmptm.train.optim import build_optimizer, freeze

log = logging.getLogger(__name__)


class NonFiniteLoss(FloatingPointError):
    """Losses were NaN/inf more often than ``train.max_nonfinite_steps`` allows; the message
    names the step, the loss terms and the batch's sample keys."""


class RankStalled(TimeoutError):
    """Under DDP or FSDP, ranks stopped answering for ``train.dist_timeout_s``; the message
    names them."""


#: how collectives fail when a peer is gone or late (gloo raises plain RuntimeErrors)
_LOST_PEER = re.compile(
    r"timed out|timeout|closed by peer|reset by peer|connection refused|broken pipe|"
    r"pair closure|connection closed",
    re.IGNORECASE,
)


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def silent_ranks(d: Dist, wait_s: float) -> list[int] | None:
    """The ranks that do not check in through the process group's store within ``wait_s``,
    once a collective failed: those are the stalled (or dead) ones. None: no store."""
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=max(wait_s, 1.0)))
        store.set(f"mmptm/alive/{d.rank}", "1")
        missing = [r for r in range(d.world) if r != d.rank]
        deadline = time.monotonic() + wait_s
        while missing and time.monotonic() < deadline:
            time.sleep(0.1)
            missing = [r for r in missing if not store.check([f"mmptm/alive/{r}"])]
        return missing
    except Exception:  # the store went with a dead rank, or was never there
        return None


def init_distributed(device_type: str, timeout_s: float = 600.0) -> Dist:
    """Join the process group that ``torchrun`` describes in the environment, if any; a
    collective that waits longer than ``timeout_s`` for a rank fails."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device_type == "cuda" else "gloo",
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _gather(obj: Any, d: Dist) -> list[Any]:
    if d.world == 1:
        return [obj]
    out: list[Any] = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


#: settings that may differ between a run and its resumption without changing the run
_RESUME_FREE = {"resume", "train.stop_at", "train.progress", "train.log_every",
                "train.ckpt_every", "train.keep_checkpoints", "train.dist_timeout_s",
                "train.max_nonfinite_steps", "train.tensorboard"}  # fmt: skip


def config_changes(old: Any, new: Any, where: str = "") -> str:
    """The settings that differ between two config trees, as ``key: old -> new`` items."""
    if where in _RESUME_FREE:
        return ""
    if isinstance(old, dict) and isinstance(new, dict):
        parts = [config_changes(old.get(k), new.get(k), f"{where}.{k}" if where else k)
                 for k in dict.fromkeys([*old, *new])]  # fmt: skip
        return ", ".join(p for p in parts if p)
    return "" if old == new else f"{where}: {old} -> {new}"


def check_writable(folder: Path) -> None:
    """Fail before training when ``folder`` cannot be created or written to."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise OSError(e.errno, f"output_dir {folder} is not writable ({e.strerror})") from None


class Trainer:
    """Builds everything a run needs from a ``RunConfig`` and runs it to ``max_steps``."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        tc = cfg.train
        check_recipe(cfg)
        device_type = "cuda" if tc.device in ("auto", "cuda") and torch.cuda.is_available() else ""
        self.dist = init_distributed(device_type or "cpu", tc.dist_timeout_s)
        self.device = pick_device(tc.device, self.dist.local_rank, setting="train.device")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.bf16 = tc.precision == "bf16" or (
            tc.precision == "auto" and self.device.type == "cuda"
        )
        self.out = Path(cfg.output_dir)
        self.ckpt_dir = self.out / checkpoint.CKPT_DIR
        if self.dist.main:
            check_writable(self.out)
        self.model, self.tokenizer = self._build_model()
        self.model.to(self.device)
        vocab = VocabInfo.from_tokenizer(self.tokenizer) if self.tokenizer else NO_TEXT
        self.stream = stream_config(
            cfg.data,
            self.tokenizer,
            needs=self.model.data_needs(),
            transforms=data_transforms(cfg.model, vocab),
            seed=cfg.seed,
            rank=self.dist.rank,
            world=self.dist.world,
        )
        self._note_shared_shards()
        #: the blocks that recompute their forward in backward (activation checkpointing)
        self.recomputed: list[nn.Module] = []
        if tc.activation_checkpointing:
            self.recomputed = parallel.checkpoint_blocks(self.model, tc.block_modules)
        #: FSDP with one rank holds the whole model, as fully_shard would; its checkpoints are
        #: sharded ones all the same, so that the run can go on with more ranks
        self.sharded = tc.parallel == "fsdp"
        #: parameters every FSDP rank holds whole (scalars); their gradients are averaged here
        self.replicated: list[nn.Parameter] = []
        #: the model is sharded across ranks
        self.fsdp = self.sharded and self.dist.world > 1
        if self.fsdp:
            self.replicated = parallel.shard(self.model, tc.block_modules, self.bf16)
        # after sharding: the optimiser holds the sharded parameters
        self.optimizer, self.scheduler = build_optimizer(
            self.model, tc, fused=self.device.type == "cuda"
        )
        self.net: nn.Module = self.model
        if self.dist.world > 1 and not self.sharded:
            self.net = DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=tc.find_unused_parameters,
            )
        if tc.compile:
            self.net = torch.compile(self.net)
        #: parameter constraints to apply after each optimiser step (a clamped temperature)
        self.objectives = [m for m in self.model.modules() if isinstance(m, Objective)]
        self.step = 0
        self.data_state = DataState()
        #: optimiser steps skipped for a non-finite loss (kept in checkpoints)
        self.nonfinite_skipped = 0
        #: seconds spent in the training loop, over all sessions of a resumed run
        self.elapsed_s = 0.0
        #: model FLOPs of one step, all ranks (counted in the first step) and peak FLOP/s
        self.flops_per_step: int | None = None
        self._flops_logged = False
        self.peak_flops = flops.peak_flops(self.device, tc.peak_flops)

    def _build_model(self) -> tuple[PretrainModel, Any]:
        """The model (seeded alike on every rank), its ``init=`` weights loaded and the
        ``train.freeze`` patterns applied; and the tokenizer."""
        cfg = self.cfg
        init = init_from(cfg)
        seed_everything(cfg.seed)  # identical initial weights on every rank
        model, tokenizer = build_model(cfg)
        if init is not None and cfg.init_mode != "architecture":
            only = ""
            if cfg.init_mode == "encoders":
                only = encoder_prefixes(model, init.model, cfg.init)
            load_init(model, init.model, cfg.init, only=only)
        frozen = freeze(model, cfg.train.freeze)
        if frozen and self.dist.main:
            n = sum(p.numel() for p in model.parameters() if not p.requires_grad)
            log.info("train.freeze: %d tensors, %d parameters not trained", len(frozen), n)
        return model, tokenizer

    def _note_shared_shards(self) -> None:
        """Say so when the ranks cannot each read whole shards of their own."""
        shards = [len(src.urls) for src in self.stream.sources]
        shared = shards[0] % self.dist.world if len(shards) == 1 else 0
        if shared and not self.cfg.data.resampled and self.dist.main:
            log.info(
                "%d shards for %d ranks: every rank reads %d of them each epoch and keeps 1/%d "
                "of their samples (a multiple of %d shards reads each shard once)",
                shards[0], self.dist.world, shared, self.dist.world, self.dist.world,
            )  # fmt: skip

    # -- checkpoints ---------------------------------------------------------------------------

    def save(self) -> Path:
        states = _gather(
            {
                "rng": checkpoint.rng_state(),
                "data": asdict(self.loader.state),
                "rank": self.dist.rank,
            },
            self.dist,
        )
        path = checkpoint.checkpoint_path(self.ckpt_dir, self.step, self.sharded)
        common = {
            "scheduler": self.scheduler.state_dict(),
            "ranks": states,
            "world_size": self.dist.world,
            "config": to_dict(self.cfg),
            "keep": self.cfg.train.keep_checkpoints,
            "extra": {"nonfinite_skipped": self.nonfinite_skipped, "elapsed_s": self.elapsed_s},
        }
        try:
            if self.sharded:  # every rank writes its shards
                checkpoint.write_sharded(
                    self.ckpt_dir, self.step, state=self._sharded_state(), **common
                )
            elif self.dist.main:
                checkpoint.write(
                    self.ckpt_dir,
                    self.step,
                    model=self.model.state_dict(),
                    optimizer=self.optimizer.state_dict(),
                    **common,
                )
        except OSError as e:  # a full disk: the write was atomic, the last one stands
            kept = checkpoint.list_checkpoints(self.ckpt_dir)
            note = f"; {kept[-1].name} is kept" if kept else ""
            raise OSError(e.errno, f"cannot write {path} ({e.strerror or e}){note}") from None
        if self.dist.world > 1:
            dist.barrier()
        return path

    def _sharded_state(self) -> dict[str, Any]:
        """Model and optimiser state as DCP saves and loads it: this rank's shards (whole
        tensors without FSDP), optimiser state keyed by parameter name."""
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def _load_weights(self, ckpt: Checkpoint) -> None:
        """Model and optimiser from either kind of checkpoint, whatever this run's kind."""
        if ckpt.sharded:  # DCP reshards to this run's ranks, or gathers into a whole model
            state = self._sharded_state()
            checkpoint.load_sharded(ckpt.path, state)
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optimizer"],
            )
        elif self.fsdp:  # a .pt file into FSDP shards
            # the optimiser's parameters are numbered in the order of its groups: name them
            names = {id(p): n for n, p in self.model.named_parameters()}
            order = [names[id(p)] for g in self.optimizer.param_groups for p in g["params"]]
            saved = ckpt.optimizer or {}
            optimizer = {
                "state": {order[i]: s for i, s in saved.get("state", {}).items()},
                "param_groups": [
                    {**g, "params": [order[i] for i in g["params"]]}
                    for g in saved.get("param_groups", [])
                ],
            }
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=ckpt.model,
                optim_state_dict=optimizer,
                options=StateDictOptions(full_state_dict=True),
            )
        else:
            self.model.load_state_dict(ckpt.model)
            self.optimizer.load_state_dict(ckpt.optimizer)

    def restore(self, ckpt: Checkpoint) -> None:
        regrouped = ckpt.world_size != self.dist.world
        if regrouped and not self.sharded:
            raise ValueError(
                f"{ckpt.path} was written by {ckpt.world_size} ranks; resuming with "
                f"{self.dist.world} would change which samples each rank sees (with "
                "train.parallel=fsdp a run resumes at another number of ranks)"
            )
        theirs = ckpt.config.get("train", {}).get("max_steps")
        if theirs is not None and theirs != self.cfg.train.max_steps:
            raise ValueError(
                f"{ckpt.path} belongs to a run with train.max_steps={theirs}, this one has "
                f"{self.cfg.train.max_steps}: to continue that run, repeat the overrides of its "
                f"first command (train.max_steps={theirs}) with resume=true; for another "
                "schedule, use another output_dir"
            )
        # both sides validated: a key an older version saved elsewhere (upgraded) or did not
        # have yet (its default now) is not a change
        changed = config_changes(to_dict(ckpt.run_config()), to_dict(self.cfg))
        if changed and self.dist.main:
            log.warning("resuming with settings changed since %s: %s", ckpt.path, changed)
        self._load_weights(ckpt)
        self.scheduler.load_state_dict(ckpt.scheduler)
        self.step = ckpt.step
        if regrouped:
            self._regroup(ckpt)
        else:
            mine = ckpt.ranks[self.dist.rank]
            checkpoint.set_rng_state(mine["rng"])
            self.data_state = DataState(**mine["data"])
        self.nonfinite_skipped = int(ckpt.extra.get("nonfinite_skipped", 0))
        self.elapsed_s = float(ckpt.extra.get("elapsed_s", 0.0))
        log.info("resumed from %s at step %d", ckpt.path, self.step)

    def _regroup(self, ckpt: Checkpoint) -> None:
        """Data position and RNG after a resume at another number of ranks: which samples a
        rank reads depends on the number of ranks, so positions within an epoch do not carry
        over. The run goes on at the start of the next epoch (of the current one if no rank
        had begun it), so that no sample is seen twice within an epoch, and every rank's RNG
        is seeded from the seed, the step and its rank."""
        states = [DataState(**r["data"]) for r in ckpt.ranks]
        epoch = max(s.epoch for s in states)
        begun = any(sum(s.consumed) or s.next_worker for s in states if s.epoch == epoch)
        skipped = sum(s.skipped_before for s in states)  # this epoch's are lost with it
        self.data_state = DataState(
            epoch=epoch + begun, skipped_before=skipped if self.dist.main else 0
        )
        seed_everything(self.cfg.seed + 1_000_003 * ckpt.step + self.dist.rank)
        if self.dist.main:
            log.warning(
                "%s was written by %d ranks, this run has %d: model, optimiser and schedule "
                "continue from step %d; the data continue at the start of epoch %d (samples "
                "left in epoch %d are not read), with the RNG seeded anew",
                ckpt.path, ckpt.world_size, self.dist.world, ckpt.step, epoch + begun, epoch,
            )  # fmt: skip

    def _maybe_resume(self) -> None:
        r = self.cfg.resume
        if r is False:
            found = checkpoint.list_checkpoints(self.ckpt_dir)
            if found:
                raise ValueError(
                    f"output_dir {self.out} has checkpoints of an earlier run (up to "
                    f"{found[-1].name}): resume=true continues it; to start over, use another "
                    f"output_dir or delete {self.ckpt_dir}"
                )
            return
        if r is True:
            if not checkpoint.list_checkpoints(self.ckpt_dir):
                log.info("resume=true but %s has no checkpoint: starting fresh", self.ckpt_dir)
                return
            r = self.ckpt_dir
        ckpt = checkpoint.read(r, weights=False)
        while True:
            try:
                return self.restore(ckpt)
            except checkpoint.BrokenCheckpoint as e:  # on every rank: all go back together
                if ckpt.path == Path(r):  # named explicitly
                    raise
                ckpt = checkpoint.read(r, weights=False, before=ckpt.step)
                log.warning("%s; using the previous one, %s", e, ckpt.path)

    # -- the loop ------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _report(self, out, keys: list[str]) -> str:
        """Which loss terms of a micro-batch are non-finite, and its samples."""
        names = [
            f"{k}={v.float().sum().item()}"
            for k, v in out.terms.items()
            if k.endswith("loss") and not torch.isfinite(v).all()
        ] or [f"loss={out.loss.item()}"]
        shown = ", ".join(keys[:8]) + (" ..." if len(keys) > 8 else "")
        rank = f"rank {self.dist.rank}, " if self.dist.world > 1 else ""
        return f"{', '.join(names)} ({rank}batch keys: {shown})"

    def _all_reports(self, reports: list[str]) -> list[str]:
        """Every rank's reports of non-finite micro-batches this step: all ranks skip or stop
        together (one that stopped alone would leave the others waiting in an all-reduce)."""
        if self.dist.world == 1:
            return reports
        flag = torch.tensor([len(reports)], device=self.device)
        dist.all_reduce(flag)
        if not int(flag.item()):
            return []
        return [r for rank_reports in _gather(reports, self.dist) for r in rank_reports]

    def train_step(self, batches) -> dict[str, float] | None:
        """One optimiser step over ``grad_accum`` micro-batches; returns averaged terms, or
        None when a loss was not finite and the step was skipped (``max_nonfinite_steps``)."""
        tc = self.cfg.train
        self.net.train()
        sums: dict[str, float] = {}
        reports: list[str] = []
        # the first step's FLOPs are counted (the passes as they run, see ``flops``)
        count = None
        if self.flops_per_step is None:
            names = {id(m): n for n, m in self.model.named_modules()}
            count = flops.FlopCount([names[id(m)] for m in self.recomputed])
        # model.starts: the objectives not started yet, set when it changes (a compiled model
        # guards on the attribute)
        starts = self.cfg.model.starts
        waiting = frozenset(n for n, s in starts.items() if self.step < s * tc.max_steps)
        if waiting != self.model.waiting:
            self.model.waiting = waiting
        for micro in range(tc.grad_accum):
            batch = move_to(next(batches), self.device)
            with self._gradient_sync(micro == tc.grad_accum - 1):
                with self._autocast(), count.forward() if count else contextlib.nullcontext():
                    out = self.net(batch)
                # backward even when not finite: DDP and FSDP expect every rank's gradients
                with count.backward() if count else contextlib.nullcontext():
                    (out.loss / tc.grad_accum).backward()
            loss = out.loss.item()
            if not math.isfinite(loss):
                reports.append(self._report(out, batch["__key__"]))
            sums["loss"] = sums.get("loss", 0.0) + loss
            for k, v in out.terms.items():
                sums[k] = sums.get(k, 0.0) + v.float().item()
        parallel.average_gradients(self.replicated)
        if count is not None:
            self.flops_per_step = self._sum_ranks(count.flops)
        bad = self._all_reports(reports)
        if bad:
            self.optimizer.zero_grad(set_to_none=True)
            self._skip_nonfinite(f"non-finite loss at step {self.step + 1}: " + "; ".join(bad))
            return None
        terms = {k: v / tc.grad_accum for k, v in sums.items()}
        if tc.clip_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.clip_grad_norm)
            terms["grad_norm"] = float(norm)
        self.optimizer.step()
        for objective in self.objectives:
            objective.after_step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return terms

    def _gradient_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """Gradients are reduced across ranks in the last micro-batch's backward only."""
        if isinstance(self.net, DistributedDataParallel) and not last:
            return self.net.no_sync()
        if self.fsdp:
            self.model.set_requires_gradient_sync(last)  # type: ignore[operator]
        return contextlib.nullcontext()

    def _sum_ranks(self, value: int) -> int:
        if self.dist.world == 1:
            return value
        total = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(total)
        return int(total.item())

    def _throughput(self, steps: float, seconds: float) -> dict[str, float]:
        """``flops_per_step`` (in the first row of a process) and ``mfu`` for a logged row."""
        row: dict[str, float] = {}
        if self.flops_per_step is None:
            return row
        if not self._flops_logged:
            row["flops_per_step"] = self.flops_per_step
            self._flops_logged = True
        if self.peak_flops and seconds > 0:
            mfu = flops.mfu(self.flops_per_step, steps / seconds, self.peak_flops, self.dist.world)
            row["mfu"] = round(mfu, 6)
        return row

    def _skip_nonfinite(self, message: str) -> None:
        """Skip the step (no update), or stop when ``train.max_nonfinite_steps`` are used up."""
        self.nonfinite_skipped += 1
        limit = self.cfg.train.max_nonfinite_steps
        if self.nonfinite_skipped > limit:
            note = f" (train.max_nonfinite_steps={limit} skipped before)" if limit else ""
            raise NonFiniteLoss(message + note)
        if self.dist.main:
            log.warning(
                "%s: step skipped, no update (%d of train.max_nonfinite_steps=%d)",
                message,
                self.nonfinite_skipped,
                limit,
            )

    def fit(self) -> dict[str, Any]:
        """Train to ``train.max_steps``; returns the last logged metrics."""
        cfg, tc = self.cfg, self.cfg.train
        self._maybe_resume()
        metrics: MetricsLog | None = None
        if self.dist.main:
            self.out.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out / "config.yaml")
            # what a killed run left: half-written files (MetricsLog drops its rows and
            # hides its events past the resumed step)
            stale = checkpoint.remove_temporaries(self.ckpt_dir)
            stale += remove_temporaries(self.out / METRICS_FILE)
            stale += remove_temporaries(self.out / "config.yaml")
            if stale:
                log.info("removed %d temporary files of an interrupted run", len(stale))
            metrics = MetricsLog(self.out, self.step, tensorboard=tc.tensorboard,
                                 config_text=(self.out / "config.yaml").read_text())  # fmt: skip
        agree = self._agree if self.dist.world > 1 else None
        self.loader = Loader(self.stream, cfg.data.num_workers, self.data_state, agree)
        batches = iter(self.loader)
        bar = progress_bar(
            total=tc.max_steps,
            initial=self.step,
            desc=self.out.name or "train",
            unit="step",
            every=tc.log_every,
            enabled=tc.progress and self.dist.main,
        )
        last: dict[str, Any] = {}
        samples = 0
        step_samples = tc.grad_accum * cfg.data.batch_size * self.dist.world
        end = min(tc.max_steps, tc.stop_at) if tc.stop_at > 0 else tc.max_steps
        t0 = tick = time.perf_counter()
        try:
            while self.step < end:
                terms = self.train_step(batches)
                now = time.perf_counter()
                self.elapsed_s, tick = self.elapsed_s + now - tick, now
                if terms is None:  # a non-finite loss, skipped
                    continue
                samples += step_samples
                if self.step % tc.log_every == 0 or self.step == end:
                    dt = now - t0
                    last = {
                        "step": self.step,
                        "samples": self.step * step_samples,
                        "elapsed_s": round(self.elapsed_s, 3),
                        "lr": self.scheduler.get_last_lr()[0],
                        **{k: round(v, 6) for k, v in terms.items()},
                        "samples_per_s": round(samples / dt, 2) if dt > 0 else math.nan,
                        "data_skipped": self._skipped(),
                        "nonfinite_skipped": self.nonfinite_skipped,
                        "epoch": self.loader.state.epoch,
                        **self._throughput(
                            samples / (tc.grad_accum * cfg.data.batch_size * self.dist.world), dt
                        ),
                    }
                    bar.set_postfix(loss=f"{terms['loss']:.4g}",
                                    samples_per_s=f"{last['samples_per_s']:.4g}")  # fmt: skip
                    if metrics is not None:
                        metrics.write(last)
                    samples, t0 = 0, time.perf_counter()
                bar.update(1)  # after the postfix: a progress line shows this step's loss
                if self.step % tc.ckpt_every == 0 or self.step == end:
                    self.save()
            skipped = self._skipped()
        except RuntimeError as e:
            if self.dist.world > 1 and (isinstance(e, dist.DistError) or _LOST_PEER.search(str(e))):
                raise self._stalled(e) from e
            raise
        finally:
            bar.close()
            if metrics is not None:
                metrics.close()
        if skipped and self.dist.main:
            log.warning("%d bad samples were skipped (see warnings above)", skipped)
        return last

    def _stalled(self, err: BaseException) -> RankStalled:
        """What to tell when a collective failed: which ranks stopped answering."""
        timeout = f"train.dist_timeout_s={self.cfg.train.dist_timeout_s:g}"
        at = f"at step {self.step + 1}"
        reason = " ".join(str(err).split()) or type(err).__name__
        silent = silent_ranks(self.dist, min(self.cfg.train.dist_timeout_s, 30.0))
        if silent:
            who = f"rank {silent[0]}" if len(silent) == 1 else f"ranks {silent}"
            return RankStalled(
                f"{who} stopped answering {at}: no reply within {timeout} (stalled, or exited: "
                f"see its own message); rank {self.dist.rank} stops too"
            )
        if silent == []:
            return RankStalled(
                f"rank {self.dist.rank} lost the other ranks {at} ({reason}); they are alive, "
                f"so this rank was the late one, by more than {timeout}"
            )
        return RankStalled(f"rank {self.dist.rank} lost the other ranks {at} ({reason}; {timeout})")

    def _agree(self, status: int) -> list[int]:
        """Every rank's data status for the next batch (see ``Loader``)."""
        mine = torch.tensor([status], dtype=torch.int32, device=self.device)
        out = [torch.zeros_like(mine) for _ in range(self.dist.world)]
        dist.all_gather(out, mine)
        return [int(t.item()) for t in out]

    def _skipped(self) -> int:
        """Bad samples skipped so far by all ranks."""
        return self._sum_ranks(self.loader.skipped)


def pretrain(cfg: RunConfig) -> dict[str, Any]:
    """Run a pre-training job described by ``cfg``; returns the last logged metrics."""
    trainer: Trainer | None = Trainer(cfg)
    finished = False
    try:
        last = trainer.fit()
        finished = True
        return last
    finally:
        trainer = None
        leave_process_group(wait=finished)


def leave_process_group(wait: bool = True) -> None:
    """End this rank's part in the process group, once its trainers are dropped.

    The process group is only destroyed (its gloo threads joined) when its last reference
    goes, and a trainer holds one through the DDP reducer or FSDP's device mesh, inside
    reference cycles that only the garbage collector frees. Left to the collector's
    whim, that could happen during interpreter shutdown, where a gloo thread freeing a
    tensor aborts the process ("terminate called without an active exception") after a
    finished run: so collect first, then (``wait``: after a run that ended well) wait for
    the other ranks, as a rank that tears its gloo pairs down while another still uses them
    aborts, then destroy.
    """
    if not dist.is_initialized():
        return
    gc.collect()
    try:
        if wait:
            dist.barrier()
    finally:
        dist.destroy_process_group()


def exit_rank(status: int) -> NoReturn:
    """End a rank's process now, with ``status``, skipping interpreter shutdown.

    Under FSDP2 something inside torch (C++ side: no Python object refers to it) keeps the
    destroyed process group, and with it gloo's threads and the store, until the process
    ends; their destructors then run during interpreter shutdown, which can abort a rank
    whose run finished well. A rank has nothing left to do once its command returned (every
    file is closed, ``leave_process_group`` ran): flush what is buffered and leave.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(status)
