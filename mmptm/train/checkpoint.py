"""Checkpoints: written atomically, holding everything needed to resume exactly."""

from __future__ import annotations

import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

CKPT_RE = re.compile(r"^step_(\d+)\.pt$")


def rng_state() -> dict[str, Any]:
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Checkpoints in ``ckpt_dir`` ordered by step."""
    d = Path(ckpt_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := CKPT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def checkpoint_path(ckpt_dir: str | Path, step: int) -> Path:
    return Path(ckpt_dir) / f"step_{step:08d}.pt"


def prune(ckpt_dir: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (keep <= 0 keeps all)."""
    if keep <= 0:
        return
    for p in list_checkpoints(ckpt_dir)[:-keep]:
        p.unlink(missing_ok=True)


def resolve_checkpoint(path_or_dir: str | Path) -> Path:
    """A checkpoint file, or the latest one in a run directory / its checkpoints folder."""
    p = Path(path_or_dir)
    if p.is_file():
        return p
    for d in (p / "checkpoints", p):
        found = list_checkpoints(d)
        if found:
            return found[-1]
    raise FileNotFoundError(f"no checkpoint (step_*.pt) in {p} or {p / 'checkpoints'}")


def load(path: str | Path) -> dict[str, Any]:
    # weights_only=False: the checkpoint holds RNG states and plain dicts we wrote ourselves.
    return torch.load(path, map_location="cpu", weights_only=False)
