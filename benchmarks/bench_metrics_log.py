"""What logging a row costs: ``metrics.jsonl`` alone vs. with TensorBoard, and ``mmptm plot``.

The trainer writes one row every ``train.log_every`` steps (flushed, so a killed run keeps
it); this times ``MetricsLog.write`` with the rows a CLIP run logs, alternating blocks of
rows with and without TensorBoard, and then draws the rows with ``plot_curves``. Compare
the per-row cost with a training step (clip_tiny: about 200 ms on 2 CPU cores).

    .venv/bin/python benchmarks/bench_metrics_log.py [--rows 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from mmptm.eval.curves import plot_curves
from mmptm.train.metrics_log import MetricsLog


def row(step: int) -> dict[str, float]:
    """A row of clip_tiny's metrics.jsonl (its keys and magnitudes)."""
    return {"step": step, "samples": 64 * step, "elapsed_s": 0.2 * step, "lr": 1e-3 / step,
            "loss": 4.1 / step**0.3, "contrastive_loss": 4.1 / step**0.3,
            "contrastive_acc": 1 - 1 / step**0.5, "contrastive_logit_scale": 14.3 + step / 100,
            "grad_norm": 1.5, "samples_per_s": 310.5, "data_skipped": 0,
            "nonfinite_skipped": 0, "epoch": step // 60}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200, help="rows per timed block")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    per_row: dict[str, list[float]] = {"jsonl": [], "jsonl+tensorboard": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in per_row:
                out = Path(tmp) / f"{name}-{r}"
                out.mkdir()
                log = MetricsLog(out, 0, tensorboard=name != "jsonl", config_text="seed: 0\n")
                t0 = time.perf_counter()
                for step in range(1, args.rows + 1):
                    log.write(row(step))
                per_row[name].append((time.perf_counter() - t0) / args.rows * 1e3)
                log.close()
            print(f"round {r + 1}: " + "  ".join(f"{k} {v[-1]:.3f} ms/row"
                                                 for k, v in per_row.items()))  # fmt: skip
        for name, ms in per_row.items():
            print(f"{name:18} median {statistics.median(ms):.3f} ms per row "
                  f"(min {min(ms):.3f}, max {max(ms):.3f})")  # fmt: skip
        runs = [Path(tmp) / f"jsonl-{r}" for r in range(2)]
        t0 = time.perf_counter()
        import matplotlib.figure  # noqa: F401  (plot_curves imports it on first use)

        t1 = time.perf_counter()
        plot_curves(runs, ["*_loss", "contrastive_acc", "lr"], Path(tmp) / "curves.png")
        print(f"importing matplotlib {t1 - t0:.2f} s; plot_curves (2 runs × {args.rows} rows, "
              f"3 metrics) {time.perf_counter() - t1:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
