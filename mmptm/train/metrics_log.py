"""Where a run's logged rows go: ``metrics.jsonl`` and TensorBoard event files beside it.

Both hold each step once, also across resumes: rows after the step a run resumes from are
dropped from ``metrics.jsonl``, and the new event file starts with a purge mark that makes
TensorBoard hide the old events from that step on (``SummaryWriter(purge_step=...)``).
The event files sit in the run directory itself, so ``tensorboard --logdir runs/`` names
each curve after its run.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

from mmptm.eval.curves import AXIS_COLUMNS, METRICS_FILE
from mmptm.io import write_atomic

log = logging.getLogger(__name__)

_OPTIM = ("lr", "grad_norm")
_SYSTEM = ("samples_per_s", "data_skipped", "nonfinite_skipped", "epoch", "flops_per_step", "mfu")


def keep_rows_until(metrics_path: Path, step: int) -> None:
    """Drop the rows of steps after ``step`` (logged by a run that was then resumed from an
    earlier checkpoint, and about to be logged again) and a half-written last line."""
    if not metrics_path.exists():
        return
    lines = metrics_path.read_text().splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("step", 0) <= step and line.endswith("\n"):
            kept.append(line)
    if kept != lines:
        write_atomic(metrics_path, lambda f: f.write("".join(kept).encode()))


def scalar_tag(key: str) -> str:
    """The TensorBoard tag of a row key: grouped as ``loss/``, ``metric/``, ``optim/`` and
    ``system/`` (TensorBoard draws one section per prefix); the key itself is unchanged."""
    if key.endswith("loss"):
        section = "loss"
    elif key in _OPTIM:
        section = "optim"
    elif key in _SYSTEM:
        section = "system"
    else:
        section = "metric"
    return f"{section}/{key}"


@functools.cache
def _summary_writer_class() -> Any:
    """``SummaryWriter``, or None (with one warning per process) without tensorboard."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        log.warning(
            "train.tensorboard: cannot import torch.utils.tensorboard (%s); metrics go to "
            "metrics.jsonl only (pip install tensorboard, or set train.tensorboard=false)",
            e,
        )
        return None
    return SummaryWriter


_EVENT_FILE = re.compile(r"^events\.out\.tfevents\.(\d+)\.")


def _after_existing_event_files(out: Path) -> None:
    """Wait, if needed, until a new event file's name sorts after those already in ``out``.

    TensorBoard reads a folder's event files in name order, and the name starts with the
    creation second, then the host and the process id. A run resumed in the same second as
    the killed one's file was created, by a process with a lower id, would sort first: its
    steps would then be read before the older file's, which TensorBoard takes for a restart
    and drops them. Waiting for the next second (once, at most a second) keeps the order.
    """
    stamps = [int(m.group(1)) for p in out.glob("events.out.tfevents.*")
              if (m := _EVENT_FILE.match(p.name))]  # fmt: skip
    if stamps:
        while int(time.time()) <= max(stamps):
            time.sleep(0.05)


class MetricsLog:
    """Appends rows to ``<out>/metrics.jsonl`` (and TensorBoard) from ``step`` + 1 on.

    ``config_text``: the resolved config, shown in TensorBoard's text tab (written by a
    fresh run only; a resumed run keeps the first one's).
    """

    def __init__(
        self, out: Path, step: int, *, tensorboard: bool = True, config_text: str = ""
    ) -> None:
        path = out / METRICS_FILE
        keep_rows_until(path, step)
        self.file = path.open("a")
        self.writer = None
        cls = _summary_writer_class() if tensorboard else None
        if cls is not None:
            # a fresh run purges from step 0: events of an earlier run in this folder
            # (whose checkpoints were deleted) disappear, as its rows did
            _after_existing_event_files(out)
            self.writer = cls(log_dir=str(out), purge_step=step + 1 if step else 0)
            if not step and config_text:
                block = "\n".join("    " + line for line in config_text.splitlines())
                self.writer.add_text("config", block, 0)
            self.writer.flush()

    def write(self, row: dict[str, Any]) -> None:
        """One row; flushed, so a killed run keeps what it logged (as up to its kill)."""
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.writer is not None:
            step = int(row["step"])
            for key, value in row.items():
                if key not in AXIS_COLUMNS and isinstance(value, (int, float)):
                    self.writer.add_scalar(scalar_tag(key), value, step)
            self.writer.flush()

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()
