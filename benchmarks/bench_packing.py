"""Packed rows vs. padded rows: training samples/s and the share of real tokens per step.

For each multilingual recipe, a ``Trainer`` is built as ``mmptm pretrain`` builds it over the
real parallel text of ``real_parallel.py``, once with every source that may pack
(``data.sources.<name>.pack``: mono and TLM; XLCO's stacked pairs never) padded
(``pack=0``) and once packed at ``--pack``. The same number of batches is drawn from each
loader and held in memory; then rounds alternate between the two, timing ``--steps``
optimiser steps from memory, so only the model's work differs. Printed: samples/s (median
of the rounds), the share of real (non-padding) tokens in the computed rows, rows and row
length per batch.

    python benchmarks/real_parallel.py prepare --data data/real_parallel
    .venv/bin/python benchmarks/bench_packing.py --data data/real_parallel \\
        [--recipes mbert_tiny,xlm_tlm_tiny] [--pack mono=128,tlm=192] [--steps 30] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_parallel import recipe_overrides

from mmptm.data.pipeline import Loader
from mmptm.recipe import load_run_config
from mmptm.train.trainer import Trainer


def held_batches(recipe: str, data: Path, extra: list[str], n: int, out: str):
    over = [*recipe_overrides(recipe, data), f"output_dir={out}", "train.progress=false", *extra]
    t = Trainer(load_run_config(recipe, over))
    loader = iter(Loader(t.stream, t.cfg.data.num_workers))
    return t, [next(loader) for _ in range(n)]


def real_share(batches: list[dict]) -> tuple[float, float, float]:
    """Real tokens / computed tokens, mean rows and mean row length per batch."""
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    computed = sum(b["input_ids"].numel() for b in batches)
    rows = statistics.mean(b["input_ids"].shape[0] for b in batches)
    width = statistics.mean(b["input_ids"].shape[1] for b in batches)
    return real / computed, rows, width


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="real_parallel.py prepare's folder")
    p.add_argument("--recipes", default="mbert_tiny,xlm_tlm_tiny")
    p.add_argument("--pack", default="mono=128,tlm=192", help="source=tokens per packed row")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pack = dict(kv.split("=") for kv in args.pack.split(","))
    rows = []
    for recipe in args.recipes.split(","):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            sources = load_run_config(recipe, [])
            names = [s for s in sources.data.sources if s in pack]
            packed = [f"data.sources.{s}.pack={pack[s]}" for s in names]
            unpacked = [f"data.sources.{s}.pack=0" for s in names]
            runs = {
                "padded": held_batches(recipe, args.data, unpacked, args.steps, a),
                f"packed ({', '.join(f'{s} {pack[s]}' for s in names)})": held_batches(
                    recipe, args.data, packed, args.steps, b
                ),
            }
            rate: dict[str, list[float]] = {k: [] for k in runs}
            for t, held in runs.values():  # warm-up: Adam's state, allocator
                for _ in range(3):
                    t.train_step(iter(held))
            for r in range(args.rounds):
                for name in runs if r % 2 == 0 else list(runs)[::-1]:
                    t, held = runs[name]
                    t0 = time.perf_counter()
                    it = iter(held)
                    for _ in range(args.steps):
                        t.train_step(it)
                    rate[name].append(
                        args.steps * t.cfg.data.batch_size / (time.perf_counter() - t0)
                    )
            for name, (t, held) in runs.items():
                share, n_rows, width = real_share(held)
                r = rate[name]
                rows.append((recipe, name, statistics.median(r), min(r), max(r), share, n_rows,
                             width, t.cfg.data.batch_size))  # fmt: skip
                print(f"{recipe} {name}: {rows[-1][2]:.0f} samples/s", flush=True)
    print(f"\n{torch.get_num_threads()} torch threads, {args.rounds} rounds of {args.steps} steps "
          "from memory\n")  # fmt: skip
    print("| recipe | rows | samples/s (median; range) | real tokens / computed "
          "| rows × length per batch (samples) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for recipe, name, med, lo, hi, share, n_rows, width, bs in rows:
        print(f"| {recipe} | {name} | {med:.0f} ({lo:.0f}–{hi:.0f}) | {100 * share:.0f}% | "
              f"{n_rows:.1f} × {width:.0f} ({bs}) |")  # fmt: skip


if __name__ == "__main__":
    main()
