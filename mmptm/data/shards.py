"""Deterministic, atomic writer of webdataset tar shards.

Every data converter (toyworld, COCO, VQA, XNLI...) writes through :class:`ShardWriter`, so
that the same samples always give byte-identical shards and an interrupted run never leaves a
truncated shard under a final name.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["ShardWriter", "encode_member"]

# Fixed header fields: anything taken from the clock or the current user would make two runs
# over the same samples differ byte for byte.
_MTIME = 0
_MODE = 0o444


def encode_member(value: Any) -> bytes:
    """Turn one sample field into the bytes stored in the tar member."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8")
    raise TypeError(
        f"cannot store a {type(value).__name__} in a shard; use bytes, str, dict or list"
    )


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key or "." in key or "/" in key:
        # webdataset splits member names at the first '.', and '/' would make a sub-folder
        raise ValueError(f"invalid sample key {key!r}: it must be non-empty, without '.' or '/'")
    return key


def _check_ext(key: str, ext: str) -> str:
    if not ext or "/" in ext or ext != ext.lower():
        # webdataset lower-cases extensions on reading, so upper case would not round-trip
        raise ValueError(
            f"sample {key!r}: invalid extension {ext!r} (non-empty, lower case, no '/')"
        )
    return ext


class ShardWriter:
    """Write samples ``{"__key__": str, ext: value}`` into numbered tar shards.

    ``pattern`` is a path with one ``%d``-style field, e.g. ``"out/train-%06d.tar"``; a new
    shard starts every ``max_count`` samples. Members are named ``<key>.<ext>`` in the sample's
    order; other ``__meta__`` fields (such as webdataset's ``__url__``) are not stored.
    Each shard is written under a temporary name in the same folder and renamed into place
    only once complete.
    """

    def __init__(self, pattern: str | os.PathLike[str], max_count: int) -> None:
        pattern = os.fspath(pattern)
        if max_count < 1:
            raise ValueError(f"max_count must be >= 1, got {max_count}")
        try:
            first, second = pattern % 0, pattern % 1
        except TypeError as exc:
            raise ValueError(f"shard pattern {pattern!r} needs one %d field") from exc
        if first == second:
            raise ValueError(f"shard pattern {pattern!r} needs one %d field")
        self.pattern = pattern
        self.max_count = max_count
        self._shards: list[str] = []
        self._count = 0
        self._in_shard = 0
        self._path: str | None = None
        self._tmp: str | None = None
        self._file: io.BufferedWriter | None = None
        self._tar: tarfile.TarFile | None = None

    @property
    def shards(self) -> list[str]:
        """Paths of the completed shards, in order."""
        return list(self._shards)

    @property
    def count(self) -> int:
        """Number of samples written so far."""
        return self._count

    def write(self, sample: dict[str, Any]) -> None:
        """Add one sample, starting a new shard when the current one is full."""
        key = _check_key(sample.get("__key__"))
        members = [
            (f"{key}.{_check_ext(key, ext)}", encode_member(value))
            for ext, value in sample.items()
            if not (ext.startswith("__") and ext.endswith("__"))
        ]
        if not members:
            raise ValueError(f"sample {key!r} has no fields to write")
        if self._tar is None:
            self._open()
        assert self._tar is not None
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = _MTIME
            info.mode = _MODE
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            self._tar.addfile(info, io.BytesIO(data))
        self._count += 1
        self._in_shard += 1
        if self._in_shard >= self.max_count:
            self._finish()

    def close(self) -> None:
        """Publish the last, partly filled shard."""
        if self._tar is not None:
            self._finish()

    def abort(self) -> None:
        """Drop the shard in progress; completed shards stay."""
        if self._tar is not None:
            self._tar.close()
        if self._file is not None:
            self._file.close()
        if self._tmp is not None and os.path.exists(self._tmp):
            os.remove(self._tmp)
        self._tar = self._file = self._tmp = self._path = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _open(self) -> None:
        self._path = self.pattern % len(self._shards)
        Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        # pid in the name: two writers aimed at the same folder must not share a temp file
        self._tmp = f"{self._path}.{os.getpid()}.tmp"
        # both stay open across write() calls, so no `with`; _finish/abort close them
        self._file = open(self._tmp, "wb")  # noqa: SIM115
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        self._in_shard = 0

    def _finish(self) -> None:
        assert self._tar is not None and self._file is not None
        assert self._tmp is not None and self._path is not None
        self._tar.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self._path)
        self._shards.append(self._path)
        self._tar = self._file = self._tmp = self._path = None
