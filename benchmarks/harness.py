"""Shared timing for the benchmarks: interleaved blocks so background load hits all alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def time_interleaved(
    steps: dict[str, Callable[[Any], Any]],
    batches: Sequence[Any],
    *,
    batch_size: int,
    rounds: int,
    steps_per_round: int,
    warmup: int,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, list[float]]:
    """Samples/s per round for each step function, rounds alternating between them."""
    for fn in steps.values():  # untimed: the first steps allocate optimiser state
        for i in range(max(warmup, 1)):
            fn(batches[i % len(batches)])
    sync()
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(rounds):
        line = []
        for name, fn in steps.items():
            sync()
            t0 = time.perf_counter()
            for i in range(steps_per_round):
                fn(batches[i % len(batches)])
            sync()
            rates[name].append(steps_per_round * batch_size / (time.perf_counter() - t0))
            line.append(f"{name}={rates[name][-1]:7.1f}")
        print(f"round {r + 1}/{rounds}: samples/s " + "  ".join(line), flush=True)
    return rates


def report_ratio(rates: dict[str, list[float]], ours: str, theirs: str, label: str = "") -> float:
    """Print medians, spread and paired per-round ratios; return the ratio of medians."""
    med = {n: statistics.median(v) for n, v in rates.items()}
    for n, v in rates.items():
        print(f"  {n:10} median {med[n]:8.1f} samples/s  (min {min(v):.1f}, max {max(v):.1f})")
    paired = [a / b for a, b in zip(rates[ours], rates[theirs])]
    print(f"  per-round ratios: {' '.join(f'{p:.2f}' for p in paired)}")
    ratio = med[ours] / med[theirs]
    print(f"ratio{label}={ratio:.3f}")
    return ratio


def step_gflop(loss_fn: Callable[[Any], Any], batch: Any) -> float:
    """GFLOPs of one forward and backward pass (torch's FLOP counter: matmuls, convolutions
    and attention; elementwise work is not counted). Gradients it leaves are the caller's."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        loss_fn(batch).backward()
    return counter.get_total_flops() / 1e9
