"""Shard manifests: every shard's sample count (and languages) in one small JSON file beside
the shards, so that counting a data set reads that file instead of every tar.

The file is webdataset's wids shard index, named ``shardindex.json``, in the shards' folder::

    {"__kind__": "wids-shard-index-v1", "wids_version": 1,
     "shardlist": [{"url": "train-000000.tar", "nsamples": 16, "filesize": 163840,
                    "languages": {"de": 8, "en": 8}}, ...]}

``url`` is the shard's name, relative to the manifest (wids reads the file as it is);
``filesize`` (bytes) tells whether a local shard is still the one that was counted;
``languages`` counts the samples whose ``json`` names a ``language`` (a pair's ``languages``
count as ``"en-de"``). One manifest serves every shard of its folder (``train-*``, ``val-*``):
writing one updates the entries it names. Converters write it as they write the shards
(``mmptm data NAME --manifest``); ``mmptm data manifest SPEC`` writes it for shards that
have none.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from mmptm.data.remote import RemoteOptions, RemoteStream, ShardUnavailable, is_remote
from mmptm.io import write_atomic

__all__ = [
    "MANIFEST",
    "MissingManifest",
    "ShardInfo",
    "count_languages",
    "manifest_counts",
    "manifest_url",
    "read_manifest",
    "sample_language",
    "shard_name",
    "write_manifest",
]

MANIFEST = "shardindex.json"
KIND = "wids-shard-index-v1"


class MissingManifest(ValueError):
    """Remote shards without a manifest (or not in it): their samples cannot be counted."""


@dataclass(frozen=True)
class ShardInfo:
    """One shard's entry: its samples, its size in bytes, its samples per language."""

    nsamples: int
    filesize: int | None = None
    languages: Mapping[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Where a shard's manifest lies

#: the shard a ``pipe:`` command reads: its last word ending in .tar/.tgz/.tar.gz
_PIPE_SHARD = re.compile(r"[^\s'\"]*\.(?:tar|tgz|tar\.gz)(?=$|[\s'\";|])")


def _pipe_shard(url: str) -> re.Match[str]:
    found = list(_PIPE_SHARD.finditer(url, len("pipe:")))
    if not found:
        raise MissingManifest(
            f"{url}: cannot tell which shard this command reads (no word ending in .tar), "
            "so not where its manifest lies"
        )
    return found[-1]


def shard_name(url: str) -> str:
    """A shard's name in its manifest: the last part of its path."""
    path = _pipe_shard(url).group(0) if url.startswith("pipe:") else url
    if is_remote(path):
        path = path.split("?", 1)[0]
    return path.rstrip("/").rsplit("/", 1)[-1]


def manifest_url(url: str) -> str:
    """Where the manifest of the shard ``url`` lies: ``shardindex.json`` in its folder (for
    a ``pipe:`` command, the same command with the shard's name replaced)."""
    if url.startswith("pipe:"):
        m = _pipe_shard(url)
        folder = m.group(0).rsplit("/", 1)[0] + "/" if "/" in m.group(0) else ""
        return f"{url[: m.start()]}{folder}{MANIFEST}{url[m.end() :]}"
    if is_remote(url):
        return url.split("?", 1)[0].rsplit("/", 1)[0] + "/" + MANIFEST
    return os.path.join(os.path.dirname(url), MANIFEST)


# --------------------------------------------------------------------------------------------
# Reading


def parse_manifest(data: bytes, where: str) -> dict[str, ShardInfo]:
    """The entries of a manifest file, by shard name; one-line errors naming the file."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: not a JSON shard manifest ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("shardlist"), list):
        raise ValueError(f"{where}: not a shard manifest (no 'shardlist' list)")
    entries: dict[str, ShardInfo] = {}
    for i, e in enumerate(doc["shardlist"]):
        n, size = (e.get("nsamples"), e.get("filesize")) if isinstance(e, dict) else (0, 0)
        langs = e.get("languages") or {} if isinstance(e, dict) else {}
        if (
            not isinstance(e, dict)
            or not isinstance(e.get("url"), str)
            or not isinstance(n, int)
            or n < 0
            or not (size is None or isinstance(size, int))
            or not isinstance(langs, dict)
        ):
            raise ValueError(
                f"{where}: shardlist[{i}] needs a 'url' and a count 'nsamples' >= 0 "
                "('filesize' and 'languages' are optional)"
            )
        entries[e["url"].rstrip("/").rsplit("/", 1)[-1]] = ShardInfo(n, size, dict(langs))
    return entries


@lru_cache(maxsize=256)
def _read_local(path: str, size: int, mtime: float) -> dict[str, ShardInfo]:
    with open(path, "rb") as f:
        return parse_manifest(f.read(), path)


@lru_cache(maxsize=256)
def _read_remote(url: str, opts: RemoteOptions) -> dict[str, ShardInfo] | None:
    """A remote manifest, read once per process; None if there is none (or it won't read)."""
    stream = RemoteStream(url, replace(opts, cache_dir=""))
    try:
        data = stream.read()
    except ShardUnavailable:
        return None
    finally:
        stream.close()
    return parse_manifest(data or b"", url)


def read_manifest(location: str, opts: RemoteOptions | None = None) -> dict[str, ShardInfo] | None:
    """The manifest at ``location`` (a local path or a remote URL); None if there is none."""
    if is_remote(location):
        return _read_remote(location, opts or RemoteOptions())
    try:
        st = os.stat(location)
    except FileNotFoundError:
        return None
    return _read_local(location, st.st_size, st.st_mtime)


def manifest_counts(
    urls: Sequence[str], opts: RemoteOptions | None = None, spec: str = ""
) -> list[int | None]:
    """Each shard's sample count from its manifest. A local shard gets None (count its tar)
    when there is no manifest, it lacks the shard, or it counted a file of another size; a
    remote shard without one is an error saying how to write it."""
    counts: list[int | None] = []
    for url in urls:
        where = manifest_url(url) if url.startswith("pipe:") or is_remote(url) else None
        if where is None:
            counts.append(_local_count(url))
            continue
        entries = read_manifest(where, opts)
        info = entries.get(shard_name(url)) if entries is not None else None
        if info is None:
            what = "has no manifest" if entries is None else "is not in its manifest"
            raise MissingManifest(
                f"remote shard {url} {what} {where}: write one with `mmptm data manifest "
                f"'{spec or url}'` and put it beside the shards (see docs/data/at-scale.md)"
            )
        counts.append(info.nsamples)
    return counts


def _local_count(url: str) -> int | None:
    entries = read_manifest(manifest_url(url))
    info = entries.get(shard_name(url)) if entries else None
    if info is None or info.filesize is None:
        return None
    try:
        size = os.path.getsize(url)
    except OSError:
        return None
    return info.nsamples if size == info.filesize else None


# --------------------------------------------------------------------------------------------
# Languages


def sample_language(meta: Any) -> str | None:
    """The language a sample's ``json`` names: ``language``, or a pair's ``languages``
    joined by '-'; None if it names none. ``meta``: the parsed json, or its bytes."""
    if isinstance(meta, bytes | bytearray | str):
        try:
            meta = json.loads(meta)
        except ValueError:
            return None
    if not isinstance(meta, dict):
        return None
    lang = meta.get("language")
    if isinstance(lang, str) and lang:
        return lang
    langs = meta.get("languages")
    if isinstance(langs, list) and langs and all(isinstance(x, str) for x in langs):
        return "-".join(langs)
    return None


def count_languages(metas: Iterable[Any]) -> dict[str, int]:
    """Samples per language over the samples' ``json`` (those naming one)."""
    counts = Counter(lang for m in metas if (lang := sample_language(m)) is not None)
    return dict(sorted(counts.items()))


# --------------------------------------------------------------------------------------------
# Writing

#: writers of one process (toyworld writes its views in threads) take turns at a manifest
_LOCK = threading.Lock()


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold the folder's manifest for a read-modify-write, against threads and processes."""
    with _LOCK:
        fd = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock


def manifest_json(entries: Mapping[str, ShardInfo]) -> bytes:
    """A manifest's bytes: entries sorted by name, the same entries giving the same bytes."""
    shards = []
    for name in sorted(entries):
        info = entries[name]
        entry: dict[str, Any] = {"url": name, "nsamples": info.nsamples}
        if info.filesize is not None:
            entry["filesize"] = info.filesize
        if info.languages:
            entry["languages"] = dict(sorted(info.languages.items()))
        shards.append(entry)
    # one shard a line: a manifest of 100k shards stays readable and diffs line by line
    lines = ",\n".join(" " + json.dumps(e, ensure_ascii=False) for e in shards)
    head = json.dumps({"__kind__": KIND, "wids_version": 1})[:-1]
    return f'{head}, "shardlist": [\n{lines}\n]}}\n'.encode()


def write_manifest(path: str | os.PathLike[str], entries: Mapping[str, ShardInfo]) -> Path:
    """Add ``entries`` to the local manifest ``path`` (replacing those of the same names),
    atomically; entries of shards no longer in its folder are dropped. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.parent):
        try:
            merged = parse_manifest(path.read_bytes(), str(path))
        except (OSError, ValueError):  # none yet, or one that does not read: written anew
            merged = {}
        merged.update(entries)
        merged = {n: i for n, i in merged.items() if (path.parent / n).exists()}
        data = manifest_json(merged)
        write_atomic(path, lambda f: f.write(data))
    return path
