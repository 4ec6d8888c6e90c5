"""Small file helpers every floor may use: atomic writes and the clean-up after a killed one."""

from __future__ import annotations

import glob
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def write_atomic(path: str | os.PathLike[str], write: Callable[[BinaryIO], Any]) -> None:
    """Write a file through ``write(f)`` into a temporary file beside it, then rename it over
    ``path``: a reader (or a process killed mid-write) never sees half a file. The file gets
    the permissions of any other new file (0666 less the umask; mkstemp's would be 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files that :func:`write_atomic` (path) left when it was killed."""
    path = Path(path)
    stale = sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


__all__ = ["remove_temporaries", "write_atomic"]
