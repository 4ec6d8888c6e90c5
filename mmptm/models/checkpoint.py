"""Checkpoints of a run, the one place that writes, finds, reads and prunes them.

``<run>/checkpoints/step_XXXXXXXX.pt`` holds the model, the optimiser and scheduler, every
rank's RNG state and data position, and the resolved config, so a run resumes exactly and a
checkpoint alone rebuilds its model. Files are written atomically (temporary file, fsync,
rename), so a killed write never leaves a half checkpoint under the real name.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmptm.config import apply_overrides, write_atomic
from mmptm.models.run import RunConfig, run_config

log = logging.getLogger(__name__)

CKPT_RE = re.compile(r"^step_(\d+)\.pt$")
CKPT_DIR = "checkpoints"


@dataclass
class Checkpoint:
    """What a checkpoint file holds (``optimizer``/``scheduler`` are None for imports)."""

    path: Path
    step: int
    model: dict[str, torch.Tensor]
    #: the resolved run config, as plain dicts
    config: dict[str, Any]
    optimizer: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    #: per rank: {"rng": ..., "data": DataState fields, "rank": r}
    ranks: list[dict[str, Any]] = field(default_factory=list)
    world_size: int = 1
    #: anything else the writer recorded (e.g. the source of an imported model)
    extra: dict[str, Any] = field(default_factory=dict)

    def run_config(self, overrides: Sequence[str] = ()) -> RunConfig:
        """The run's config, with ``key=value`` overrides applied."""
        return run_config(apply_overrides(self.config, overrides))


def rng_state() -> dict[str, Any]:
    """The process's Python, numpy, torch (and CUDA) RNG states."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_atomic(obj: Any, path: str | Path) -> None:
    """torch.save to a temporary file in the same folder, then rename over ``path``."""
    write_atomic(path, lambda f: torch.save(obj, f))


def remove_temporaries(ckpt_dir: str | Path) -> list[Path]:
    """Delete the temporary files of checkpoint writes that were killed before their rename."""
    d = Path(ckpt_dir)
    stale = sorted(d.glob(".step_*.pt.*.tmp")) if d.is_dir() else []
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def checkpoint_path(ckpt_dir: str | Path, step: int) -> Path:
    return Path(ckpt_dir) / f"step_{step:08d}.pt"


def write(
    ckpt_dir: str | Path,
    step: int,
    *,
    model: dict[str, torch.Tensor],
    config: dict[str, Any],
    optimizer: dict[str, Any] | None = None,
    scheduler: dict[str, Any] | None = None,
    ranks: Sequence[dict[str, Any]] = (),
    world_size: int = 1,
    keep: int = 0,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` atomically, then keep only the newest ``keep``."""
    path = checkpoint_path(ckpt_dir, step)
    save_atomic(
        {
            "step": step,
            "model": model,
            "optimizer": optimizer,
            "scheduler": scheduler,
            "ranks": list(ranks),
            "world_size": world_size,
            "config": config,
            **(extra or {}),
        },
        path,
    )
    prune(ckpt_dir, keep)
    return path


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Checkpoints in ``ckpt_dir`` ordered by step."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := CKPT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def prune(ckpt_dir: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (keep <= 0 keeps all)."""
    if keep <= 0:
        return
    for p in list_checkpoints(ckpt_dir)[:-keep]:
        p.unlink(missing_ok=True)


def resolve(path_or_dir: str | Path) -> Path:
    """A checkpoint file, or the latest one in a run directory / its checkpoints folder."""
    return _candidates(path_or_dir)[-1]


def _candidates(path_or_dir: str | Path) -> list[Path]:
    """The file itself, or a run's checkpoints ordered by step (oldest first)."""
    p = Path(path_or_dir)
    if p.is_file():
        return [p]
    for d in (p / CKPT_DIR, p):
        found = list_checkpoints(d)
        if found:
            return found
    raise FileNotFoundError(f"no checkpoint (step_*.pt) in {p} or {p / CKPT_DIR}")


_FIELDS = ("step", "model", "config", "optimizer", "scheduler", "ranks", "world_size")


def read(path_or_dir: str | Path) -> Checkpoint:
    """Read a checkpoint file, or the newest readable checkpoint of a run directory.

    A run's newest checkpoint that cannot be read (truncated by a full disk, damaged) is
    skipped with a warning naming it, and the one before is tried; a file named explicitly
    must be readable.
    """
    if Path(path_or_dir).is_file():
        return _load(Path(path_or_dir))
    broken: list[str] = []
    for path in reversed(_candidates(path_or_dir)):
        try:
            ck = _load(path)
        except ValueError as e:
            broken.append(str(e))
            continue
        if broken:
            log.warning("%s; using the previous one, %s", "; ".join(broken), path)
        return ck
    raise ValueError(f"no readable checkpoint in {path_or_dir}: " + "; ".join(broken))


def _load(path: Path) -> Checkpoint:
    try:
        # weights_only=False: the checkpoint holds RNG states and plain dicts we wrote ourselves.
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated, not a zip, bad pickle ...: all mean "broken file"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path}: cannot read this checkpoint ({reason})") from None
    missing = [k for k in ("model", "config") if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{path}: not an mmptm checkpoint (lacks {missing})")
    extra = {k: v for k, v in state.items() if k not in _FIELDS}
    return Checkpoint(
        path=path,
        step=int(state.get("step", 0)),
        model=state["model"],
        config=state["config"],
        optimizer=state.get("optimizer"),
        scheduler=state.get("scheduler"),
        ranks=list(state.get("ranks") or []),
        world_size=int(state.get("world_size", 1)),
        extra=extra,
    )
