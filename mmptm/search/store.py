"""What a search index directory holds, and the FAISS indexes in it.

    DIR/index.json              what the index is (written last, atomically: the commit point)
    DIR/items-00000.jsonl       one line per item: key, shard, texts [[lang, text]...], json
                                fields, thumbnail [offset, size] in the batch's tar
    DIR/thumbs-00000.tar        the batch's JPEG thumbnails, <key>.jpg
    DIR/part003-g00001.faiss    one FAISS index per part (a side, or a side's language)
    DIR/part003-g00001.rows.npy its rows' (item number, text number or -1), int64 [N,2]

Each ``mmptm index`` run (the build, then each ``--add``) writes one batch of items and
thumbnails and a new generation of every part it touches; ``index.json`` names the files
of the current generation, so a build that stops half-way leaves the index as it was.
``index.json`` also records every file's size and SHA-256 (``files``): opening an index
compares the sizes (a quick check), and the checksums when asked to (``--verify``).
Vectors are L2-normalised, so inner product = cosine. Index types: ``flat`` (exact),
``ivf`` (k-means cells, ``nprobe`` visited per query) and ``hnsw`` (a graph, ``ef``
candidates per query).
Legend: N vectors, E embedding width.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import logging
import math
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

log = logging.getLogger(__name__)

FORMAT = "mmptm-index"
VERSION = 1
META = "index.json"
INDEX_TYPES = ("flat", "ivf", "hnsw")
#: k-means wants at least this many training vectors per IVF cell (FAISS warns below)
MIN_POINTS_PER_CELL = 39
#: IVF k-means trains on a sample of this many vectors per cell by default (FAISS: 39 to 256)
TRAIN_PER_CELL = 64


@dataclass
class IndexOptions:
    """How each part's vectors are indexed and, by default, searched (FAISS)."""

    #: flat (exact inner product) | ivf | hnsw
    type: str = "flat"
    #: IVF cells; 0 = 4·√N, at most N/39 (each part picks its own from its size)
    nlist: int = 0
    #: HNSW links per node, and candidates kept while building
    m: int = 32
    ef_construction: int = 40
    #: query time (defaults, overridable per search): IVF cells visited, HNSW candidates
    nprobe: int = 32
    ef: int = 64
    #: IVF k-means trains on at most this many vectors (0 = 64 per cell), a seeded sample
    train_size: int = 0

    def __post_init__(self) -> None:
        if self.type not in INDEX_TYPES:
            raise ValueError(f"index type {self.type!r}: choose one of {', '.join(INDEX_TYPES)}")
        least = {"nlist": 0, "m": 2, "ef_construction": 1, "nprobe": 1, "ef": 1, "train_size": 0}
        for name, low in least.items():
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be an integer >= {low}, got {value!r}"
                )


def cells_for(opts: IndexOptions, n: int) -> int:
    """The IVF cell count for a part of ``n`` vectors."""
    most = max(1, n // MIN_POINTS_PER_CELL)
    if not opts.nlist:
        return max(1, min(round(4 * math.sqrt(n)), most))
    if opts.nlist > n:
        log.warning("nlist=%d > %d vectors in a part: using %d cells", opts.nlist, n, most)
        return most
    return opts.nlist


def new_index(opts: IndexOptions, x_NE: np.ndarray) -> tuple[faiss.Index, dict[str, Any]]:
    """A FAISS index of ``x_NE`` (trained if it needs to be) and its per-part settings."""
    n, dim = x_NE.shape
    if opts.type == "flat":
        index: faiss.Index = faiss.IndexFlatIP(dim)
        settings: dict[str, Any] = {}
    elif opts.type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, opts.m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = opts.ef_construction
        settings = {"m": opts.m}
    else:
        nlist = cells_for(opts, n)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        want = opts.train_size or TRAIN_PER_CELL * nlist
        pick = np.random.default_rng(0).permutation(n)[:want] if n > want else slice(None)
        index.train(np.ascontiguousarray(x_NE[pick]))
        settings = {"nlist": nlist, "trained_on": min(n, want)}
    index.add(x_NE)
    return index, settings


def prepare(index: faiss.Index, nprobe: int, ef: int) -> None:
    """Set the query-time parameters; IVF also gets a direct map (stored vectors by row)."""
    ivf = _ivf(index)
    if ivf is not None:
        ivf.nprobe = min(nprobe, ivf.nlist)
        ivf.make_direct_map()
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = ef


def _ivf(index: faiss.Index) -> faiss.IndexIVF | None:
    try:
        return faiss.extract_index_ivf(index)
    except RuntimeError:  # not an IVF index
        return None


class DamagedIndex(ValueError):
    """A file of the index is missing, cut short or altered (the message names it)."""


# --------------------------------------------------------------------------------------------
# index.json and the generation files


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def read_meta(path: str | Path) -> dict[str, Any]:
    """``index.json`` of an index directory; a clear error for anything else."""
    d = Path(path)
    if not d.is_dir():
        raise FileNotFoundError(f"index {d} does not exist (build one with `mmptm index`)")
    f = d / META
    if not f.is_file():
        raise ValueError(f"{d} is not an mmptm index: it has no {META}")
    try:
        meta = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{f}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{f} is not an mmptm index description (no format: {FORMAT})")
    if meta.get("version") != VERSION:
        raise ValueError(f"{f}: index version {meta.get('version')}, this mmptm reads {VERSION}")
    return meta


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    """Replace ``index.json`` atomically, with the size and SHA-256 of every file it names
    (files already recorded keep their record: they never change); then drop part files
    no generation names."""
    known = meta.get("files", {})
    meta["files"] = {n: known.get(n) or file_record(path / n) for n in named_files(meta)}
    tmp = path / f".{META}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    os.replace(tmp, path / META)
    remove_unreferenced(path, meta)


_OURS = re.compile(r"^(part\d+-g\d+\.(faiss|rows\.npy)|(items|thumbs)-\d+\.(jsonl|tar))$")


def named_files(meta: dict[str, Any]) -> list[str]:
    """The files of the index's current generation, as ``index.json`` names them."""
    named = [p[k] for p in meta.get("parts", []) for k in ("index", "rows")]
    return named + [b[k] for b in meta.get("batches", []) for k in ("items", "thumbnails")]


def file_record(path: Path) -> dict[str, Any]:
    """What ``index.json`` records of one file: its size and SHA-256."""
    with open(path, "rb") as f:
        return {"size": os.fstat(f.fileno()).st_size, "sha256": _sha256(f)}


def _sha256(f: Any) -> str:
    return hashlib.file_digest(f, "sha256").hexdigest()


def check_files(path: Path, meta: dict[str, Any], *, verify: bool = False) -> None:
    """Compare the index's files with what ``index.json`` records: their sizes (cheap, so
    always) and with ``verify`` their SHA-256 (reads every byte). A file that differs is a
    :class:`DamagedIndex` naming it. An index written before the records were kept opens
    with a warning that it cannot be verified."""
    files = meta.get("files")
    if files is None:
        log.warning(
            "%s records no file sizes or checksums (an index from an older mmptm): its files "
            "cannot be verified; `mmptm index --add` records them",
            path / META,
        )
        return
    for name in named_files(meta):
        f, want = path / name, files.get(name) or {}
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            raise DamagedIndex(f"{f}: missing (the index is damaged: rebuild it)") from None
        if size != want.get("size"):
            raise DamagedIndex(
                f"{f}: {size} bytes where {META} records {want.get('size')}: the file is "
                "damaged (cut short or overwritten); rebuild the index"
            )
        if verify:
            with open(f, "rb") as data:
                if _sha256(data) != want.get("sha256"):
                    raise DamagedIndex(
                        f"{f}: its SHA-256 differs from the one {META} records: the file is "
                        "damaged; rebuild the index"
                    )


def remove_unreferenced(path: Path, meta: dict[str, Any]) -> list[str]:
    """Delete the index's own files that ``meta`` does not name (old generations, the
    leftovers of a build that stopped); nothing else in the folder is touched."""
    named = set(named_files(meta))
    gone = [f.name for f in path.iterdir() if _OURS.match(f.name) and f.name not in named]
    for name in gone:
        (path / name).unlink()
    return gone


def write_part(
    path: Path, number: int, generation: int, index: faiss.Index, rows_N2: np.ndarray
) -> dict[str, str]:
    """Write one part's index and rows under this generation's names."""
    stem = f"part{number:03d}-g{generation:05d}"
    faiss.write_index(index, str(path / f"{stem}.faiss"))
    np.save(path / f"{stem}.rows.npy", rows_N2.astype(np.int64))
    return {"index": f"{stem}.faiss", "rows": f"{stem}.rows.npy"}


def read_part(path: Path, part: dict[str, Any]) -> tuple[faiss.Index, np.ndarray]:
    """One part's FAISS index and rows [N,2]; a file that does not read names itself."""
    f = path / part["index"]
    try:
        index = faiss.read_index(str(f))
    except RuntimeError as e:  # FAISS's message: the C++ function, then what failed
        why = str(e).split("failed: ")[-1]
        raise DamagedIndex(f"{f}: not a readable FAISS index ({why})") from None
    f = path / part["rows"]
    try:
        rows_N2 = np.load(f)
    except (ValueError, OSError, EOFError) as e:
        raise DamagedIndex(f"{f}: not readable ({e})") from None
    if rows_N2.shape != (index.ntotal, 2):
        raise DamagedIndex(
            f"{f}: {rows_N2.shape} rows where {part['index']} holds {index.ntotal} vectors"
        )
    return index, rows_N2


# --------------------------------------------------------------------------------------------
# Thumbnails: JPEGs in one tar per batch, read back by offset


class ThumbnailWriter:
    """Appends ``<key>.jpg`` members to a new tar and says where each one's bytes are."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "wb")  # noqa: SIM115 (closed by close())
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115

    def add(self, key: str, jpeg: bytes) -> list[int]:
        """[data offset, size] of the member written."""
        info = tarfile.TarInfo(f"{key}.jpg")
        info.size, info.mode, info.mtime = len(jpeg), 0o444, 0
        self._tar.addfile(info, io.BytesIO(jpeg))
        padded = -(-len(jpeg) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
        return [self._tar.offset - padded, len(jpeg)]

    def close(self) -> None:
        self._tar.close()
        self._file.close()


def read_span(path: Path, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` (thread-safe: no shared file position); fewer is a
    :class:`DamagedIndex` naming the file (its name only: servers show the message)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise DamagedIndex(f"the index is damaged: {path.name} is missing") from None
    try:
        data = os.pread(fd, size, offset)
    finally:
        os.close(fd)
    if len(data) != size:
        raise DamagedIndex(
            f"the index is damaged: {path.name} holds {len(data)} of the {size} bytes at "
            f"byte {offset}"
        )
    return data
