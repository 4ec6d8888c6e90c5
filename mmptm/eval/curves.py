"""Training curves of runs, drawn from their ``metrics.jsonl`` (``mmptm plot``, the studies).

One subplot per metric, one line per run (the same colour in every subplot). Curves are
smoothed as TensorBoard smooths them (a debiased exponential moving average), with the raw
curve drawn faintly behind. matplotlib draws off-screen (Agg): no display is needed.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
#: --x choices → the metrics.jsonl column and the axis label
X_AXES = {"step": ("step", "step"), "samples": ("samples", "samples"), "time": ("elapsed_s", "")}
#: columns that are x axes, never curves
AXIS_COLUMNS = ("step", "samples", "elapsed_s")

Run = str | Path


def read_metrics(run: Run) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (``run``: its folder or the file). A half-written
    last line (a run being written, or killed) is left out; a bad line elsewhere is an error
    naming the file and line."""
    path = Path(run)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run}: no {METRICS_FILE} (not a run directory?)")
    lines = path.read_text().splitlines(keepends=True)
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            if n == len(lines) and not line.endswith("\n"):
                break
            raise ValueError(f"{path}:{n}: not a JSON row ({line.strip()[:60]!r})") from None
        if not isinstance(row, dict) or "step" not in row:
            raise ValueError(f"{path}:{n}: a row needs a 'step' field")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} has no rows yet")
    return rows


def metric_names(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The numeric columns of ``rows`` that can be drawn, in first-seen order."""
    names: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            if key not in AXIS_COLUMNS and isinstance(value, (int, float)):
                names.setdefault(key)
    return list(names)


def select_metrics(
    patterns: Sequence[str], available: Sequence[str], *, skip_missing: bool = False
) -> list[str]:
    """The metrics that ``patterns`` (names or globs such as ``*_loss``) pick, in pattern
    order. A pattern that picks nothing is an error that lists what there is (or, with
    ``skip_missing``, is passed over: the studies draw what a recipe logs)."""
    chosen: dict[str, None] = {}
    for pattern in patterns:
        hits = [m for m in available if fnmatch.fnmatchcase(m, pattern)]
        if not hits and not skip_missing:
            raise ValueError(
                f"no run has a metric {pattern!r}; they have: {', '.join(sorted(available))}"
            )
        chosen.update(dict.fromkeys(hits))
    if not chosen:
        raise ValueError(f"none of {list(patterns)} is a metric of these runs")
    return list(chosen)


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average divided by ``1 - weight^n``
    (so the first points are not pulled towards 0); non-finite points are passed through
    and do not enter the average."""
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    out, last, n = [], 0.0, 0
    for v in values:
        if not math.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out.append(last / (1 - weight**n))
    return out


def _labels(runs: Sequence[Run] | Mapping[str, Run]) -> dict[str, Path]:
    """Label → run: a mapping as given; paths by folder name, with as many parent folders
    as it takes to tell them apart."""
    if isinstance(runs, Mapping):
        return {label: Path(run) for label, run in runs.items()}
    paths = [Path(r).resolve() for r in runs]
    for depth in range(1, max((len(p.parts) for p in paths), default=1) + 1):
        labels = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(labels)) == len(labels):
            break
    return dict(zip(labels, paths))


def _time_scale(seconds: float) -> tuple[float, str]:
    """A divisor and unit that keep the time axis readable."""
    if seconds >= 7200:
        return 3600.0, "training time (h)"
    if seconds >= 120:
        return 60.0, "training time (min)"
    return 1.0, "training time (s)"


def plot_curves(
    runs: Sequence[Run] | Mapping[str, Run],
    metrics: Sequence[str],
    out: Run,
    *,
    smoothing: float = 0.6,
    x: str = "step",
    log_y: bool = False,
    title: str = "",
    skip_missing: bool = False,
) -> Path:
    """Draw ``metrics`` (names or glob patterns) of ``runs`` (folders, or label → folder)
    into ``out`` (PNG, or any format matplotlib writes, by suffix); returns its path.

    ``x``: ``step``, ``samples`` (samples trained on) or ``time`` (seconds in the training
    loop, over all sessions of a resumed run). ``smoothing``: the TensorBoard weight (0 = raw).
    """
    if x not in X_AXES:
        raise ValueError(f"--x {x!r}: expected one of {', '.join(X_AXES)}")
    if not 0 <= smoothing < 1:
        raise ValueError(f"--smooth {smoothing:g}: a smoothing weight is in [0, 1)")
    if not runs:
        raise ValueError("no runs to plot")
    paths = _labels(runs)
    data = {label: read_metrics(run) for label, run in paths.items()}
    available = list(dict.fromkeys(m for rows in data.values() for m in metric_names(rows)))
    chosen = select_metrics(metrics, available, skip_missing=skip_missing)
    column, x_label = X_AXES[x]
    for label, rows in data.items():
        if any(column not in r for r in rows):
            raise ValueError(
                f"{paths[label]}: {METRICS_FILE} rows have no {column!r} (written before "
                "mmptm logged it): use --x step"
            )
    scale = 1.0
    if x == "time":
        longest = max(r[column] for rows in data.values() for r in rows)
        scale, x_label = _time_scale(longest)
    return _draw(data, chosen, Path(out), column, scale, x_label, smoothing, log_y, title)


def _draw(data, chosen, out, column, scale, x_label, smoothing, log_y, title) -> Path:
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise OSError(f"drawing curves needs matplotlib ({e}): pip install matplotlib") from None
    cols = 2 if len(chosen) in (2, 4) else min(len(chosen), 3)  # 4: a square, not 3 + 1
    rows_n = math.ceil(len(chosen) / cols)
    fig = Figure(figsize=(4.6 * cols, 3.3 * rows_n + 0.5), dpi=100, layout="constrained")
    colours = [f"C{i % 10}" for i in range(len(data))]
    handles: dict[str, Any] = {}
    for i, metric in enumerate(chosen):
        ax = fig.add_subplot(rows_n, cols, i + 1)
        for colour, (label, rows) in zip(colours, data.items()):
            points = [(r[column] / scale, float(r[metric])) for r in rows if metric in r]
            if not points:
                continue
            xs, ys = zip(*points)
            if smoothing > 0:
                ax.plot(xs, ys, color=colour, alpha=0.25, linewidth=1.0)
                ys = smooth(ys, smoothing)
            # a run with one row (a short fine-tuning) is a dot, not an invisible line
            marker = "o" if len(xs) == 1 else None
            (handles[label],) = ax.plot(xs, ys, color=colour, linewidth=1.8, marker=marker,
                                        label=label)  # fmt: skip
        ax.set_title(metric, fontsize=11)
        ax.set_xlabel(x_label, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.3)
        if log_y:
            ax.set_yscale("log")
    if len(data) > 1:  # one legend for the figure: a run has one colour everywhere
        fig.legend(
            [handles[k] for k in data if k in handles],
            [k for k in data if k in handles],
            loc="outside lower center",
            ncols=min(len(handles), 4),
            fontsize=9,
            frameon=False,
        )
    heading = title or (next(iter(data)) if len(data) == 1 else "")
    if heading:
        note = f" (smoothed {smoothing:g})" if smoothing > 0 else ""
        fig.suptitle(heading + note, fontsize=12)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out
