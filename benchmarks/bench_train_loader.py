"""Training steps/s with the real data loader vs the same batches held in memory.

For each recipe a ``Trainer`` is built as ``mmptm pretrain`` builds it (over toyworld, with
the recipe's loader workers); each round times ``--steps`` optimiser steps fed by the loader,
then the same batches (the ones the loader gave in that round) again from a list in memory.
The difference is what the loader costs the training loop: decoding in the workers competing
for the cores, handing batches over, stalls at epoch boundaries. It prints per round the
steps/s of both and their ratio, the CPU seconds per step of the training process and of its
loader workers, and how long the training loop waited for each batch, then the medians.

    mmptm data toyworld --out /tmp/tw --languages en,de,fr,ru,es
    mmptm tokenizer train --input '/tmp/tw/mono/train-*.tar' --out /tmp/tw/tokenizer \\
        --vocab-size 2000 --model-type bpe
    .venv/bin/python benchmarks/bench_train_loader.py --data /tmp/tw \\
        [--recipes clip_tiny,visualbert_tiny,mbert_tiny] [--rounds 5] [--steps 20] \\
        [--workers N] [--threads N]
    .venv/bin/python benchmarks/bench_train_loader.py --data /tmp/tw --compare-threads 1,2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from mmptm.data.pipeline import Loader
from mmptm.recipe import load_run_config
from mmptm.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loader import recipe_overrides

TICKS = os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's child processes (loader workers): the
    live ones, plus those that ended and were waited for (the workers of a finished epoch;
    counted in this process's cutime and cstime, fields 16 and 17 of its stat)."""
    me = os.getpid()
    own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    total = int(own[13]) + int(own[14])
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        if int(fields[1]) == me:  # ppid; utime and stime are fields 14 and 15 of stat
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


def trainer(recipe: str, data: Path, workers: int | None, out: str) -> Trainer:
    over = recipe_overrides(recipe, data, 0)
    over = [o for o in over if not o.startswith("data.num_workers=")]
    if workers is not None:
        over.append(f"data.num_workers={workers}")
    over += [f"output_dir={out}", "train.progress=false"]
    return Trainer(load_run_config(recipe, over))


def kept(batches: Iterator[dict], into: list[dict], waited: list[float]) -> Iterator[dict]:
    """``batches``, each also appended to ``into``; ``waited`` gets the seconds each took to
    arrive (the training loop waiting for data)."""
    while True:
        t = time.perf_counter()
        batch = next(batches)
        waited.append(time.perf_counter() - t)
        into.append(batch)
        yield batch


def bench(recipe: str, args: argparse.Namespace) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as out:
        t = trainer(recipe, args.data, args.workers, out)
        workers = t.cfg.data.num_workers
        loader = iter(Loader(t.stream, workers))
        for _ in range(args.warmup):  # workers start, the shuffle buffer fills, Adam's state
            t.train_step(loader)
        keys = ("loader", "memory", "ratio", "cpu_loader", "cpu_memory", "cpu_workers", "wait")
        rec: dict[str, list[float]] = {k: [] for k in keys}
        print(f"{recipe}: batch {t.cfg.data.batch_size}, {workers} loader workers, "
              f"{torch.get_num_threads()} torch threads", flush=True)  # fmt: skip
        rec["gflop"] = [t.flops_per_step / 1e9]  # the first step's, counted by the trainer
        for r in range(args.rounds):
            held: list[dict] = []
            waited: list[float] = []
            w0, c0, t0 = children_cpu_s(), time.process_time(), time.perf_counter()
            it = kept(loader, held, waited)
            for _ in range(args.steps):
                t.train_step(it)
            wall, cpu, worker_cpu = (time.perf_counter() - t0, time.process_time() - c0,
                                     children_cpu_s() - w0)  # fmt: skip
            c1, t1 = time.process_time(), time.perf_counter()
            replay = iter(held)  # the same batches, from memory
            for _ in range(args.steps):
                t.train_step(replay)
            wall_mem, cpu_mem = time.perf_counter() - t1, time.process_time() - c1
            rec["loader"].append(args.steps / wall)
            rec["memory"].append(args.steps / wall_mem)
            rec["ratio"].append(rec["loader"][-1] / rec["memory"][-1])
            rec["cpu_loader"].append(cpu / args.steps)
            rec["cpu_memory"].append(cpu_mem / args.steps)
            rec["cpu_workers"].append(worker_cpu / args.steps)
            rec["wait"].append(sum(waited) / args.steps)
            print(f"  round {r + 1}: steps/s loader {rec['loader'][-1]:.2f}  memory "
                  f"{rec['memory'][-1]:.2f}  ratio {rec['ratio'][-1]:.3f}   CPU s/step: "
                  f"trainer {rec['cpu_loader'][-1]:.3f} vs {rec['cpu_memory'][-1]:.3f}, "
                  f"workers {rec['cpu_workers'][-1]:.3f}; waiting for batches "
                  f"{rec['wait'][-1]:.4f} s/step", flush=True)  # fmt: skip
        return rec


def bench_threads(recipe: str, args: argparse.Namespace) -> dict[int, list[float]]:
    """Steps/s from batches in memory, rounds alternating between the ``--compare-threads``
    torch thread counts (with the loader workers alive and idle, as in training)."""
    counts = [int(n) for n in args.compare_threads.split(",")]
    with tempfile.TemporaryDirectory() as out:
        t = trainer(recipe, args.data, args.workers, out)
        loader = iter(Loader(t.stream, t.cfg.data.num_workers))
        held = [next(loader) for _ in range(args.steps)]
        for _ in range(args.warmup):
            t.train_step(iter(held))
        rates: dict[int, list[float]] = {n: [] for n in counts}
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else counts[::-1]:
                torch.set_num_threads(n)
                t0 = time.perf_counter()
                replay = iter(held)
                for _ in range(args.steps):
                    t.train_step(replay)
                rates[n].append(args.steps / (time.perf_counter() - t0))
            shown = "  ".join(f"{n} threads {rates[n][-1]:.2f}" for n in counts)
            print(f"  {recipe} round {r + 1}: steps/s {shown}", flush=True)
        return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="toyworld dir with tokenizer.model")
    p.add_argument("--recipes", default="clip_tiny,visualbert_tiny,mbert_tiny")
    p.add_argument("--workers", type=int, default=None, help="default: the recipe's")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--compare-threads", default="", help="e.g. 1,2: steps/s (batches from "
                   "memory) at each torch thread count instead")  # fmt: skip
    args = p.parse_args()
    if args.compare_threads:
        for recipe in args.recipes.split(","):
            rates = bench_threads(recipe, args)
            medians = ", ".join(f"{n} threads {statistics.median(v):.2f}" for n, v in rates.items())
            print(f"{recipe}: median steps/s {medians}")
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {recipe: bench(recipe, args) for recipe in args.recipes.split(",")}
    print(f"\n| recipe | steps/s loader | steps/s memory | loader / memory (median of "
          f"{args.rounds} rounds; range) | CPU s/step trainer (loader / memory) | CPU s/step "
          "workers | waiting for batches, s/step | GFLOP/step (GFLOP/s from memory) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for recipe, rec in results.items():
        m = {k: statistics.median(v) for k, v in rec.items()}
        print(f"| {recipe} | {m['loader']:.2f} | {m['memory']:.2f} | {m['ratio']:.3f} "
              f"({min(rec['ratio']):.3f}–{max(rec['ratio']):.3f}) | {m['cpu_loader']:.3f} / "
              f"{m['cpu_memory']:.3f} | {m['cpu_workers']:.3f} | {m['wait']:.4f} | "
              f"{m['gflop']:.1f} ({m['gflop'] * m['memory']:.1f}) |")  # fmt: skip


if __name__ == "__main__":
    main()
