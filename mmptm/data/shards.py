"""Webdataset tar shards: shard specs, reading samples (skip-and-count), and writing them.

Reading: :func:`expand_shards` resolves a spec (glob, brace pattern, directory, comma list;
remote URLs and ``pipe:`` commands, see :mod:`mmptm.data.remote`), :func:`tar_samples`
groups tar members into samples with webdataset's readers, and a :class:`SkipCounter`
handler logs and counts what cannot be read instead of stopping. :func:`count_samples`
reads the shards' manifest (:mod:`mmptm.data.manifest`) where there is one.
:func:`check_shard` scans a shard's headers for the damage a streaming reader stops at
without a word (garbage in the middle, a file cut short at a header).
Writing: every converter (toyworld, COCO, VQA, XNLI...) writes through :class:`ShardWriter`,
so the same samples always give byte-identical shards and an interrupted run never leaves a
truncated shard under a final name; under ``mmptm data NAME --manifest`` (:func:`manifests`)
it also writes the shards' manifest.
"""

from __future__ import annotations

import glob
import io
import json
import logging
import os
import re
import tarfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any

import braceexpand

from mmptm.data.manifest import (
    MANIFEST,
    ShardInfo,
    manifest_counts,
    sample_language,
    write_manifest,
)
from mmptm.data.remote import (
    RemoteOptions,
    ShardUnavailable,
    check_backend,
    is_remote,
    open_shard,
)
from mmptm.modalities.base import Sample

__all__ = [
    "ShardCheck",
    "ShardWriter",
    "SkipCounter",
    "check_shard",
    "count_samples",
    "encode_member",
    "expand_shards",
    "manifests",
    "read_sample",
    "read_shard",
    "tar_samples",
]

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# Reading


def expand_shards(spec: str) -> list[str]:
    """Resolve a shard spec into a list of shards; an error names what's missing.

    Local parts (globs, brace patterns, directories) give existing tar paths, sorted per
    part. Remote parts (``http(s)://``, ``pipe:``, ``s3://``...) are brace-expanded in the
    order written; whether they exist is known when they are read (their manifest lists
    them, see :func:`count_samples`). Parts are separated by commas outside braces."""
    if not spec:
        raise ValueError("no shards given (set data.train / data.val / data.test)")
    urls: list[str] = []
    for part in (p.strip() for p in _split_spec(spec)):
        if not part:
            continue
        if is_remote(part):
            check_backend(part)
            urls += braceexpand.braceexpand(part)
            continue
        if os.path.isdir(part):
            found = sorted(glob.glob(os.path.join(part, "*.tar")))
        else:
            found = []
            for pattern in braceexpand.braceexpand(part):
                found += sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        missing = [u for u in found if not os.path.exists(u)]
        if missing:
            raise FileNotFoundError(f"shard {missing[0]!r} (from {part!r}) does not exist")
        if not found:
            raise FileNotFoundError(f"shard spec {part!r} matches no files")
        urls += found
    return urls


def _split_spec(spec: str) -> list[str]:
    """A spec's parts: split at the commas outside braces (``{a,b}`` is one brace pattern)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += (ch == "{") - (ch == "}")
        if ch == "," and depth <= 0:
            parts.append(spec[start:i])
            start = i + 1
    return [*parts, spec[start:]]


class SkipCounter:
    """A webdataset-style handler that logs and counts bad input instead of raising.

    ``report=False``: skip silently and count nothing, for a reader of a shard that another
    reader also reads and reports (see ``pipeline.reader_samples``).
    """

    def __init__(self, report: bool = True) -> None:
        self.report = report
        self.count = 0
        self.last = ""

    def __call__(self, exn: BaseException) -> bool:
        if not self.report:
            return True
        self.count += 1
        self.last = _describe(exn)
        log.warning("skipped bad input (%d so far): %s", self.count, self.last)
        return True  # keep going

    def lose(self, count: int, what: str) -> None:
        """Count ``count`` samples a reader could not reach, e.g. past damage in a shard."""
        if not self.report:
            return
        self.count += count
        self.last = what
        log.warning("skipped %d samples (%d so far): %s", count, self.count, what)

    def skip(self, sample: Sample, reason: str) -> None:
        self(ValueError(f"sample {sample.get('__key__')!r} in {sample.get('__url__')}: {reason}"))


def _describe(exn: BaseException) -> str:
    """One line naming the shard: webdataset appends (stream, url) to a reader's error."""
    args = exn.args
    if len(args) > 1 and isinstance(args[-1], str):
        return f"{args[-1]}: {type(exn).__name__}: {args[0]}"
    return str(exn)


Handler = Callable[[BaseException], bool]


def tar_samples(
    urls: Iterable[str], handler: Handler, remote: RemoteOptions | None = None
) -> Iterator[Sample]:
    """Open tar shards and group members into samples by ``__key__`` (webdataset's readers).
    Remote shards are read as ``remote`` says (retries, timeout, cache)."""
    # Imported here: webdataset imports torch, which reading text files alone does not need.
    from webdataset.tariterators import group_by_keys, tar_file_expander

    streams = _opened(urls, handler, remote or RemoteOptions())
    files = tar_file_expander(streams, handler=handler)
    yield from group_by_keys(files, handler=handler)


def _opened(urls: Iterable[str], handler: Handler, opts: RemoteOptions) -> Iterator[dict]:
    """webdataset's ``url_opener`` ({url, stream} per shard, errors to ``handler``); a remote
    shard's stream is closed once the next one is asked for (its connection, its command)."""
    from webdataset.tariterators import url_opener

    last = None
    try:
        for url in urls:
            if last is not None:
                last.close()
                last = None
            if not is_remote(url):
                yield from url_opener([{"url": url}], handler=handler)
                continue
            try:
                last = open_shard(url, opts)
            except Exception as exn:
                exn.args = (*exn.args, url)
                if handler(exn):
                    continue
                break
            yield {"url": url, "stream": last}
    finally:
        if last is not None:
            last.close()


class _Errors:
    """A handler that keeps the errors of one shard's reading, to be counted after it."""

    def __init__(self) -> None:
        self.seen: list[BaseException] = []

    def __call__(self, exn: BaseException) -> bool:
        self.seen.append(exn)
        return True


def read_shard(
    url: str, handler: SkipCounter, remote: RemoteOptions | None = None, expected: int | None = None
) -> Iterator[Sample]:
    """One shard's samples, bad input skipped and counted by ``handler``. A remote shard that
    fails (gone, or down past the retries) counts the samples it did not give: ``expected``
    (its manifest's count) less those read, with one warning naming the shard and the fault."""
    if not is_remote(url) or not handler.report:
        yield from tar_samples([url], handler, remote)
        return
    errors = _Errors()
    n = 0
    for sample in tar_samples([url], errors, remote):
        n += 1
        yield sample
    if errors.seen:
        fault = next((e for e in errors.seen if isinstance(e, ShardUnavailable)), None)
        what = str(fault.detail) if fault else _describe(errors.seen[0])
        lost = max(expected - n, 1) if expected is not None else len(errors.seen)
        handler.lose(lost, f"{what}; {n} samples read" if n else what)


@lru_cache(maxsize=4096)
def _count(url: str, size: int, mtime: float) -> int:
    with tarfile.open(url) as tar:
        return len({m.name.split("/")[-1].split(".")[0] for m in tar if m.isfile()})


def count_samples(urls: Iterable[str], remote: RemoteOptions | None = None) -> int:
    """Samples (distinct keys) in tar shards: from their manifest where it lists them (a
    local shard of the size it counted), else from a local shard's headers (cached per file
    version); a remote shard without a manifest is an error saying how to write one."""
    urls = list(urls)
    total = 0
    for u, n in zip(urls, manifest_counts(urls, remote), strict=True):
        if n is None:
            st = os.stat(u)
            n = _count(u, st.st_size, st.st_mtime)
        total += n
    return total


@dataclass(frozen=True)
class ShardCheck:
    """What a scan of one shard's tar headers found: its samples, and where it is damaged."""

    url: str
    #: distinct sample keys a streaming reader gets (up to the damage, if any)
    samples: int
    #: samples whose headers lie past the damage: a reader stops before them
    lost: int = 0
    #: what is wrong, in one line; None for a sound shard
    error: str | None = None
    #: byte offset of the damage (of the end, for a file cut short)
    offset: int | None = None
    #: a streaming reader stops at the damage without an error (training counts it here)
    silent: bool = False


def check_shard(url: str) -> ShardCheck:
    """Scan a shard's headers (cached per file version). A streaming tar reader takes an
    unreadable header past the first for the end of the archive, so garbage in the middle
    of a shard, or a shard cut at a header, loses the samples after it without an error:
    this finds such damage (anything but zeros after the last member, or no end marker)
    and counts the samples past it by looking for intact headers further on."""
    st = os.stat(url)
    return _check(url, st.st_size, st.st_mtime)


@lru_cache(maxsize=4096)
def _check(url: str, size: int, mtime: float) -> ShardCheck:
    keys: set[str] = set()
    with open(url, "rb") as f:
        try:
            tar = _open_tar(f)
        except tarfile.ReadError as e:
            what = "an empty file" if size == 0 else f"not a tar file ({e})"
            return ShardCheck(url, 0, error=what, offset=0)
        last = None
        try:
            for last in tar:
                _add_key(keys, last)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
            after = f" in member {last.name!r}" if last is not None else ""
            if str(e) == "unexpected end of data":
                what = f"cut short: the file ends at byte {size}{after}"
                return ShardCheck(url, len(keys), error=what, offset=size)
            return ShardCheck(url, len(keys), error=f"unreadable{after}: {e}", offset=tar.offset)
        end, data = tar.offset, tar.fileobj
        data.seek(end)
        tail = 0
        while chunk := data.read(1 << 20):
            zeros = len(chunk) - len(chunk.lstrip(b"\0"))
            if zeros < len(chunk):
                at = end + tail + zeros
                if data is f and size - end < tarfile.BLOCKSIZE:
                    what = f"cut short: the file ends at byte {size} inside a tar header"
                    return ShardCheck(url, len(keys), error=what, offset=size, silent=True)
                lost = len(_keys_past(f, at) - keys) if data is f else 0
                what = f"damaged at byte {at} (not a tar header): {lost} samples past it are lost"
                return ShardCheck(url, len(keys), lost, what, at, silent=True)
            tail += len(chunk)
    if not tail:
        what = f"no end-of-archive marker after byte {end}: the file may be cut short"
        return ShardCheck(url, len(keys), error=what, offset=end, silent=True)
    return ShardCheck(url, len(keys))


def _open_tar(f: io.BufferedReader) -> tarfile.TarFile:
    """A tar (compressed or not) for random access; a plain tar's error if neither opens."""
    try:
        return tarfile.open(fileobj=f, mode="r:")
    except tarfile.ReadError as plain:
        f.seek(0)
        try:
            return tarfile.open(fileobj=f, mode="r:*")
        except tarfile.ReadError:
            raise plain from None


#: members webdataset's reader leaves out (its ``skip_meta``)
_META = re.compile(r"__[^/]*__($|/)")


def _add_key(keys: set[str], member: tarfile.TarInfo) -> None:
    """Add the sample key of a member, as webdataset groups members into samples."""
    from webdataset.tariterators import base_plus_ext

    if member.isreg() and not _META.match(member.name):
        key, _ = base_plus_ext(member.name)
        if key is not None:
            keys.add(key)


def _keys_past(f: io.BufferedReader, start: int) -> set[str]:
    """Sample keys of the intact members after byte ``start``: from each valid header found
    further on (the "ustar" magic, a right checksum), read on as a tar of its own."""
    keys: set[str] = set()
    pos = start + 1
    while (at := _next_header(f, pos)) is not None:
        f.seek(at)
        with tarfile.open(fileobj=f, mode="r:") as tar:
            try:
                for member in tar:
                    _add_key(keys, member)
            except tarfile.ReadError:  # cut short further on
                break
            pos = max(tar.offset, at + tarfile.BLOCKSIZE)
    return keys


def _next_header(f: io.BufferedReader, pos: int, chunk: int = 1 << 20) -> int | None:
    """Offset of the first valid tar header at or after ``pos``; None if there is none."""
    magic = 257  # where a header holds "ustar"
    while True:
        f.seek(pos)
        buf = f.read(chunk + magic + 5)  # overlapping reads: no magic is cut in two
        i = buf.find(b"ustar", magic)
        while 0 <= i < chunk + magic:
            f.seek(pos + i - magic)
            try:
                tarfile.TarInfo.frombuf(f.read(tarfile.BLOCKSIZE), "utf-8", "surrogateescape")
                return pos + i - magic
            except tarfile.HeaderError:
                i = buf.find(b"ustar", i + 1)
        if len(buf) < chunk + magic + 5:
            return None
        pos += chunk


@lru_cache(maxsize=64)
def _members(url: str, size: int, mtime: float) -> dict[str, dict[str, tuple[int, int]]]:
    """key → {extension: (data offset, size)} of a shard, grouped as webdataset groups."""
    from webdataset.tariterators import base_plus_ext

    found: dict[str, dict[str, tuple[int, int]]] = {}
    with tarfile.open(url) as tar:
        for m in tar:
            key, ext = base_plus_ext(m.name) if m.isreg() else (None, None)
            if key is not None:
                found.setdefault(key, {})[ext.lower()] = (m.offset_data, m.size)
    return found


def read_sample(url: str, key: str) -> Sample:
    """One sample of a shard by its key, as :func:`tar_samples` would give it.

    Random access: the shard's headers are read once per file version (cached), then only
    the sample's members. ``KeyError`` if the shard has no such sample, ``OSError`` if the
    shard is gone.
    """
    st = os.stat(url)
    members = _members(url, st.st_size, st.st_mtime).get(key)
    if members is None:
        raise KeyError(f"sample {key!r} is not in {url}")
    sample: Sample = {"__key__": key, "__url__": url}
    with open(url, "rb") as f:
        for ext, (offset, size) in members.items():
            f.seek(offset)
            sample[ext] = f.read(size)
    return sample


# --------------------------------------------------------------------------------------------
# Writing

#: whether a ShardWriter not told otherwise writes its shards' manifest (see :func:`manifests`)
_MANIFESTS = False


@contextmanager
def manifests(enabled: bool = True) -> Iterator[None]:
    """Within: every :class:`ShardWriter` not told otherwise writes its shards' manifest
    (``mmptm data NAME --manifest`` runs the converter in this, so that any converter
    writes one)."""
    global _MANIFESTS
    before, _MANIFESTS = _MANIFESTS, enabled
    try:
        yield
    finally:
        _MANIFESTS = before


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
    only once complete. ``manifest``: on closing, add the shards' sample counts and
    languages to the manifest of their folder (:mod:`mmptm.data.manifest`); None = as
    :func:`manifests` says (off by default).
    """

    def __init__(
        self, pattern: str | os.PathLike[str], max_count: int, manifest: bool | None = None
    ) -> None:
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
        self.manifest = _MANIFESTS if manifest is None else manifest
        #: completed shards' manifest entries, by path
        self._infos: dict[str, ShardInfo] = {}
        self._languages: Counter[str] = Counter()

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
        if self.manifest and (lang := sample_language(sample.get("json"))) is not None:
            self._languages[lang] += 1
        self._count += 1
        self._in_shard += 1
        if self._in_shard >= self.max_count:
            self._finish()

    def close(self) -> None:
        """Publish the last, partly filled shard (and the manifest, if written)."""
        if self._tar is not None:
            self._finish()
        folders: dict[str, dict[str, ShardInfo]] = {}
        for path, info in self._infos.items():
            folders.setdefault(os.path.dirname(path), {})[os.path.basename(path)] = info
        for folder, infos in folders.items():
            write_manifest(os.path.join(folder, MANIFEST), infos)
        self._infos = {}

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
        self._languages.clear()

    def _finish(self) -> None:
        assert self._tar is not None and self._file is not None
        assert self._tmp is not None and self._path is not None
        self._tar.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self._path)
        self._shards.append(self._path)
        if self.manifest:
            languages = dict(sorted(self._languages.items()))
            size = os.path.getsize(self._path)
            self._infos[self._path] = ShardInfo(self._in_shard, size, languages)
        self._tar = self._file = self._tmp = self._path = None
