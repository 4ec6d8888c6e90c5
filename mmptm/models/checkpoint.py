"""Checkpoints of a run, the one place that writes, finds, reads and prunes them.

``<run>/checkpoints/step_XXXXXXXX.pt`` holds the model, the optimiser and scheduler, every
rank's RNG state and data position, and the resolved config, so a run resumes exactly and a
checkpoint alone rebuilds its model. Files are written atomically (temporary file, fsync,
rename), so a killed write never leaves a half checkpoint under the real name.

A sharded run (FSDP) writes ``step_XXXXXXXX.dcp/`` instead: the model and optimiser as
``torch.distributed.checkpoint`` files, each rank writing its own shards, plus ``meta.pt``
with everything else. Every rank writes into ``.step_XXXXXXXX.dcp.tmp/``, which rank 0
renames once all have finished. Such a folder loads at any number of ranks (DCP reshards),
and ``read`` loads its whole model in one process, without a process group, so evaluation,
``init=`` and imports treat both kinds alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import random
import re
import shutil
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from mmptm.config import apply_overrides
from mmptm.io import write_atomic
from mmptm.recipe import RunConfig, run_config

log = logging.getLogger(__name__)

CKPT_RE = re.compile(r"^step_(\d+)\.(pt|dcp)$")
CKPT_DIR = "checkpoints"
#: the file of a sharded checkpoint's folder with all but the model and optimiser
META = "meta.pt"


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

    @property
    def sharded(self) -> bool:
        """A ``.dcp`` folder: its optimiser (and, read without weights, its model) is loaded
        into a live model with :func:`load_sharded`."""
        return is_sharded(self.path)

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
    """Delete the temporary files and folders of checkpoint writes that were killed before
    their rename."""
    d = Path(ckpt_dir)
    stale = sorted([*d.glob(".step_*.pt.*.tmp"), *d.glob(".step_*.dcp*.tmp")]) if d.is_dir() else []
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return stale


def checkpoint_path(ckpt_dir: str | Path, step: int, sharded: bool = False) -> Path:
    return Path(ckpt_dir) / f"step_{step:08d}.{'dcp' if sharded else 'pt'}"


def is_sharded(path: str | Path) -> bool:
    """A sharded checkpoint's folder (``step_N.dcp``)."""
    return Path(path).suffix == ".dcp"


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


def _no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


def write_sharded(
    ckpt_dir: str | Path,
    step: int,
    *,
    state: dict[str, Any],
    config: dict[str, Any],
    scheduler: dict[str, Any] | None = None,
    ranks: Sequence[dict[str, Any]] = (),
    world_size: int = 1,
    keep: int = 0,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``step_N.dcp/`` (called by every rank): ``state`` ({"model": ..., "optimizer":
    ...}, sharded or whole tensors) through DCP, the rest in ``meta.pt`` by rank 0, which then
    renames the temporary folder and keeps only the newest ``keep`` checkpoints. A shared
    file system is needed when ranks run on several machines."""
    import torch.distributed.checkpoint as dcp

    path = checkpoint_path(ckpt_dir, step, sharded=True)
    tmp = path.parent / f".{path.name}.tmp"
    with _dcp_call():
        dcp.save(state, checkpoint_id=tmp, no_dist=_no_dist())
    # DCP's rank 0 wrote .metadata after every rank reported its files written: all are there
    if _no_dist() or dist.get_rank() == 0:
        meta = {"step": step, "scheduler": scheduler, "ranks": list(ranks),
                "world_size": world_size, "config": config, **(extra or {})}  # fmt: skip
        save_atomic(meta, tmp / META)
        if path.exists():  # the same step written again after a resume from an earlier one
            old = path.parent / f".{path.name}.old.tmp"
            os.replace(path, old)
            shutil.rmtree(old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        prune(ckpt_dir, keep)
    return path


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BrokenCheckpoint(ValueError):
    """A sharded checkpoint's data that cannot be loaded (every rank raises it together)."""


def load_sharded(path: str | Path, state: dict[str, Any]) -> None:
    """Fill ``state`` (as given to :func:`write_sharded`: this run's sharded or whole
    tensors) in place from the folder ``path``, at any number of ranks (all call this)."""
    import torch.distributed.checkpoint as dcp

    try:
        with _dcp_call():
            dcp.load(state, checkpoint_id=Path(path), no_dist=_no_dist())
    except Exception as e:  # damaged data that passed read's checks
        raise BrokenCheckpoint(f"{path}: cannot read this checkpoint ({_damaged(e)})") from None


@contextlib.contextmanager
def _dcp_call() -> Iterator[None]:
    """Around a DCP call: its errors as the first failing rank's exception (DCP wraps them
    in a BaseException, which neither ``except Exception`` nor the CLI's error report sees),
    and no warning that one process without a process group is one process."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            yield
    except CheckpointException as e:
        raise next(iter(e.failures.values()))[0] from None


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
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def resolve(path_or_dir: str | Path) -> Path:
    """A checkpoint file, or the latest one in a run directory / its checkpoints folder."""
    return _candidates(path_or_dir)[-1]


def _candidates(path_or_dir: str | Path) -> list[Path]:
    """The file itself, or a run's checkpoints ordered by step (oldest first)."""
    p = Path(path_or_dir)
    if p.is_file() or (is_sharded(p) and p.is_dir()):
        return [p]
    for d in (p / CKPT_DIR, p):
        found = list_checkpoints(d)
        if found:
            return found
    raise FileNotFoundError(f"no checkpoint (step_*.pt, step_*.dcp) in {p} or {p / CKPT_DIR}")


_FIELDS = ("step", "model", "config", "optimizer", "scheduler", "ranks", "world_size")


def read(path_or_dir: str | Path, weights: bool = True, before: int | None = None) -> Checkpoint:
    """Read a checkpoint file or folder, or the newest readable checkpoint of a run directory.

    A run's newest checkpoint that cannot be read (truncated by a full disk, damaged) is
    skipped with a warning naming it, and the one before is tried; a checkpoint named
    explicitly must be readable. ``weights=False``: a sharded checkpoint's model is left
    empty (a resuming trainer loads its shards with :func:`load_sharded`), after checking
    that every file its index names is there, whole. ``before``: only checkpoints of
    earlier steps (the one of that step failed to load).
    """
    p = Path(path_or_dir)
    if p.is_file() or (is_sharded(p) and p.is_dir()):
        return _load(p, weights)
    broken: list[str] = []
    for path in reversed(_candidates(path_or_dir)):
        if before is not None and int(CKPT_RE.match(path.name).group(1)) >= before:
            continue
        try:
            ck = _load(path, weights)
        except ValueError as e:
            broken.append(str(e))
            continue
        if broken:
            log.warning("%s; using the previous one, %s", "; ".join(broken), path)
        return ck
    raise ValueError(f"no readable checkpoint in {path_or_dir}: " + "; ".join(broken))


def _reason(e: BaseException) -> str:
    if isinstance(e, pickle.UnpicklingError):  # its first line is about weights_only
        return "damaged data: cannot unpickle"
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _damaged(e: BaseException) -> str:
    """The reason for an error raised by shard data that passed the size checks: garbled
    bytes fail in many ways (a bad pickle opcode, an index out of range, a huge length)."""
    reason = _reason(e)
    return reason if reason.startswith("damaged data") else f"damaged data: {reason}"


def _load(path: Path, weights: bool = True) -> Checkpoint:
    if path.is_dir():
        return _load_sharded(path, weights)
    try:
        # weights_only=False: the checkpoint holds RNG states and plain dicts we wrote ourselves.
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated, not a zip, bad pickle ...: all mean "broken file"
        raise ValueError(f"{path}: cannot read this checkpoint ({_reason(e)})") from None
    return _checkpoint(path, state)


def _load_sharded(path: Path, weights: bool) -> Checkpoint:
    """``meta.pt`` and, with ``weights``, the whole model of a ``.dcp`` folder, in this
    process alone (as DCP's ``dcp_to_torch_save``, but only the model's tensors)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        state = torch.load(path / META, map_location="cpu", weights_only=False)
        index = dcp.FileSystemReader(path).read_metadata()
        for info in index.storage_data.values():  # a missing or truncated shard file
            file = path / info.relative_path
            if not file.is_file() or file.stat().st_size < info.offset + info.length:
                raise OSError(f"{info.relative_path} is missing or shorter than its index says")
        model: dict[str, torch.Tensor] = {}
        if weights:
            for key, md in index.state_dict_metadata.items():
                if key.startswith("model.") and isinstance(md, TensorStorageMetadata):
                    model[key.removeprefix("model.")] = torch.empty(
                        md.size, dtype=md.properties.dtype
                    )
            try:
                with _dcp_call():
                    dcp.load(
                        {"model": model}, storage_reader=dcp.FileSystemReader(path), no_dist=True
                    )
            except Exception as e:  # the shard files' bytes: any error means damaged data
                raise ValueError(_damaged(e)) from None
    except Exception as e:  # a file missing, truncated or garbled
        raise ValueError(f"{path}: cannot read this checkpoint ({_reason(e)})") from None
    if isinstance(state, dict):
        state["model"] = model
    return _checkpoint(path, state)


def _checkpoint(path: Path, state: Any) -> Checkpoint:
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
