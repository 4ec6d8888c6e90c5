"""Converters from the formats video corpora ship in to webdataset shards.

Readers for MSR-VTT (annotation JSON + video folder), a caption CSV over a video folder
(WebVid / video2dataset style) and a caption CSV over pre-extracted features (``.npy`` per
video). Videos are stored as they are (never re-encoded): the member's extension is the
file's (``mp4``, ``webm`` or ``mkv``). Shard members:

- video-text: ``<ext>`` (the video bytes), ``txt`` (the first caption), ``json`` =
  ``{"video_id" | "file", "captions": {lang: [caption, ...]}, ...}``
- features: ``npy`` ([T,F] float16/float32, float64 stored as float32), ``txt``, ``json``
  (as above, plus ``"frames": T, "dim": F``)

Every converter returns ``{"written": n, "skipped": {reason: n}, "skipped_items": {reason:
[what, ...]}, "shards": [...]}`` like the image converters, and logs one summary line per
reason instead of a warning per item (a corpus download often misses thousands of videos).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmptm.converters import print_stats
from mmptm.converters.text import SkipStats
from mmptm.data.shards import ShardWriter
from mmptm.progress import progress_bar
from mmptm.registry import CONVERTERS, default_of

__all__ = [
    "VIDEO_EXTENSIONS",
    "convert_msrvtt",
    "convert_video_csv",
    "convert_video_features",
    "load_features",
    "probe_video",
]

log = logging.getLogger(__name__)
PathLike = str | os.PathLike[str]

VIDEO_EXTENSIONS = ("mp4", "webm", "mkv")
_CODE = re.compile(r"[A-Za-z0-9_-]+")  # splits and languages go into file names and json keys
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_MSRVTT_SPLITS = {"train": ("train",), "val": ("validate", "val"), "test": ("test",)}
_RESERVED = {"file", "caption", "language", "split"}  # CSV columns with a meaning
_SHOWN = 10  # names in a summary line


def _check_common(split: str, shard_size: int, folder: PathLike, what: str) -> None:
    if not isinstance(split, str) or not _CODE.fullmatch(split):
        raise ValueError(f"invalid split {split!r}: use letters, digits, '_' or '-'")
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder}: {what} folder not found")


def _summarise(stats: SkipStats) -> None:
    """One log line per skip reason, naming the first few items."""
    for reason, n in stats.skipped.items():
        items = [str(i) for i in stats.where.get(reason, [])[:_SHOWN]]
        more = f" (+{n - len(items)} more)" if n > len(items) else ""
        log.warning("%s: skipped %d (%s): %s%s", stats.source, n, reason, ", ".join(items), more)


def probe_video(path: PathLike) -> None:
    """Raise ValueError (naming the file) unless PyAV opens it and decodes a first frame."""
    import av  # imported here: converting text or features must not need it

    try:
        with av.open(os.fspath(path)) as container:
            if not container.streams.video:
                raise ValueError(f"{path}: no video stream")
            next(container.decode(video=0))
    except StopIteration:
        raise ValueError(f"{path}: no frame could be decoded") from None
    except (av.FFmpegError, OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable video ({type(exc).__name__}: {exc})") from None


def _video_ext(path: Path) -> str | None:
    ext = path.suffix.lower().lstrip(".")
    return ext if ext in VIDEO_EXTENSIONS else None


def _key(text: str) -> str:
    """A shard key from a file name or id: no '.' or '/' (webdataset splits names on them)."""
    return _KEY_UNSAFE.sub("_", text).strip("_") or "_"


# ---------------------------------------------------------------------------------------------
# MSR-VTT


def _read_keys(path: PathLike) -> list[str]:
    """Video ids, one a line (blank lines and ``#`` comments ignored)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: key list not found")
    keys = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            keys.append(line)
    if not keys:
        raise ValueError(f"{path}: no video ids")
    return keys


def _find_video(folder: Path, video_id: str) -> Path | None:
    for ext in VIDEO_EXTENSIONS:
        path = folder / f"{video_id}.{ext}"
        if path.is_file():
            return path
    return None


def convert_msrvtt(
    video_dir: PathLike,
    annotations_json: PathLike,
    out_dir: PathLike,
    *,
    split: str = "all",
    keys: PathLike | Sequence[str] | None = None,
    shard_size: int = 1000,
    progress: bool = False,
) -> dict[str, Any]:
    """MSR-VTT's annotation JSON + its video folder to ``{split}-%06d.tar``, one sample a video.

    The JSON (``train_val_videodatainfo.json``, ``test_videodatainfo.json`` or MSRVTT_data
    .json) has ``videos`` (``video_id``, ``split``, ...) and ``sentences`` (``video_id``,
    ``caption``, ``sen_id``). ``split``: "train", "val" (MSR-VTT's "validate"), "test" or "all".
    ``keys``: a file of video ids (one a line, e.g. the 1k-A test list) or the ids themselves:
    only these videos, in that order (ids not in the JSON are skipped as ``unknown_video``).
    Samples: key = video id, the video file's bytes under its extension, ``txt`` = the first
    caption (by ``sen_id``), ``json`` = ``{"video_id", "split", "category", "url",
    "start_time", "end_time", "captions": {"en": [...]}, "sen_ids": [...]}``. Videos without a
    file in ``video_dir`` are skipped as ``missing_video``; ones without captions as
    ``no_captions``.
    """
    if split != "all" and split not in _MSRVTT_SPLITS:
        raise ValueError(f"unknown split {split!r}; choices: all, {', '.join(_MSRVTT_SPLITS)}")
    _check_common(split, shard_size, video_dir, "video")
    path = Path(annotations_json)
    data = _read_msrvtt_json(path)
    stats = SkipStats(os.fspath(path), "items")
    videos, captions = _msrvtt_videos(data, stats)
    if keys is not None:
        wanted = _read_keys(keys) if isinstance(keys, str | os.PathLike) else list(keys)
    else:
        wanted = list(videos)
    accepted = _MSRVTT_SPLITS.get(split)
    folder = Path(video_dir)
    seen: set[str] = set()
    with ShardWriter(Path(out_dir) / f"{split}-%06d.tar", shard_size) as writer:
        for video_id in progress_bar(wanted, desc=f"msrvtt {split}", unit="video",
                                     enabled=progress):  # fmt: skip
            v = videos.get(video_id)
            if v is None:
                stats.skip("unknown_video", video_id, warn=False)
                continue
            if accepted is not None and v.get("split") not in accepted:
                continue  # another split's video: not a skip
            if video_id in seen:
                stats.skip("duplicate_id", video_id, warn=False)
                continue
            ordered = sorted(captions.get(video_id, []), key=_sen_order)
            if not ordered:
                stats.skip("no_captions", video_id, warn=False)
                continue
            file = _find_video(folder, video_id)
            if file is None:
                stats.skip("missing_video", video_id, warn=False)
                continue
            seen.add(video_id)
            record = _msrvtt_record(video_id, v, ordered)
            ext = _video_ext(file)
            assert ext is not None
            caps = record["captions"]["en"]
            writer.write(
                {"__key__": _key(video_id), ext: file.read_bytes(), "txt": caps[0], "json": record}
            )
            stats.written += 1
    _summarise(stats)
    return stats.result(writer.shards)


def _read_msrvtt_json(path: Path) -> dict[str, Any]:
    """MSR-VTT's annotation JSON, checked for the ``videos`` and ``sentences`` lists."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("videos"), list):
        raise ValueError(f"{path}: expected a JSON object with a list under 'videos'")
    if not isinstance(data.get("sentences"), list):
        raise ValueError(f"{path}: expected a list under 'sentences'")
    return data


def _msrvtt_videos(
    data: dict[str, Any], stats: SkipStats
) -> tuple[dict[str, dict[str, Any]], dict[str, list[tuple[Any, str]]]]:
    """The JSON's videos by id (the first entry of an id wins) and each video's
    ``(sen_id, caption)`` pairs; malformed entries are counted in ``stats``."""
    videos: dict[str, dict[str, Any]] = {}
    for i, v in enumerate(data["videos"]):
        if not isinstance(v, dict) or not isinstance(v.get("video_id"), str) or not v["video_id"]:
            stats.skip("bad_video_entry", f"videos[{i}]", warn=False)
            continue
        videos.setdefault(v["video_id"], v)
    captions: dict[str, list[tuple[Any, str]]] = {}
    for i, s in enumerate(data["sentences"]):
        ok = isinstance(s, dict) and isinstance(s.get("caption"), str)
        if not ok or not s["caption"].strip() or s.get("video_id") not in videos:
            stats.skip("bad_sentence", f"sentences[{i}]", warn=False)
            continue
        captions.setdefault(s["video_id"], []).append((s.get("sen_id", i), s["caption"].strip()))
    return videos, captions


def _msrvtt_record(
    video_id: str, v: dict[str, Any], captions: list[tuple[Any, str]]
) -> dict[str, Any]:
    """A sample's ``json``: the video's entry under our names (MSR-VTT writes "start time")
    and its ``(sen_id, caption)`` pairs, given in ``sen_id`` order."""
    return {
        "video_id": video_id,
        "split": v.get("split"),
        "category": v.get("category"),
        "url": v.get("url"),
        "start_time": v.get("start time", v.get("start_time")),
        "end_time": v.get("end time", v.get("end_time")),
        "captions": {"en": [c for _, c in captions]},
        "sen_ids": [sid for sid, _ in captions],
    }


def _sen_order(item: tuple[Any, str]) -> tuple[int, Any]:
    """Numeric sen_ids in numeric order, others after them as strings."""
    sid = item[0]
    return (0, sid) if isinstance(sid, int) else (1, str(sid))


# ---------------------------------------------------------------------------------------------
# Caption CSVs


def _csv_rows(path: PathLike, stats: SkipStats) -> Iterable[tuple[int, dict[str, str]]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in (reader.fieldnames or [])]
        if "file" not in header or "caption" not in header:
            raise ValueError(f"{path}: the header must name 'file' and 'caption', got {header}")
        reader.fieldnames = header
        for row in reader:
            if None in row or any(v is None for v in row.values()):
                stats.skip("malformed", reader.line_num, warn=False)
                continue
            yield reader.line_num, {k: v.strip() for k, v in row.items()}


class _Grouped:
    """CSV rows grouped by file in first-appearance order: captions per language, extra columns."""

    def __init__(self) -> None:
        self.files: dict[str, dict[str, Any]] = {}

    def add(self, row: dict[str, str], language: str) -> None:
        entry = self.files.setdefault(
            row["file"],
            {"captions": {}, "extra": {k: v for k, v in row.items() if k not in _RESERVED}},
        )
        entry["captions"].setdefault(language, []).append(row["caption"])


def _group_csv(path: PathLike, split: str, stats: SkipStats) -> _Grouped:
    """The CSV's rows of ``split`` (all rows when it has no ``split`` column)."""
    grouped = _Grouped()
    for line, row in _csv_rows(path, stats):
        if row.get("split") and row["split"] != split:
            continue  # another split's row
        language = row.get("language") or "en"
        if not row["file"] or not row["caption"]:
            stats.skip("empty", line, warn=False)
        elif not _CODE.fullmatch(language):
            stats.skip("bad_language", line, warn=False)
        else:
            grouped.add(row, language)
    return grouped


def _primary_caption(captions: dict[str, list[str]]) -> str:
    lang = "en" if "en" in captions else next(iter(captions))
    return captions[lang][0]


def _safe_path(root: Path, name: str) -> Path | None:
    """``root / name`` unless ``name`` escapes ``root`` (absolute, or through '..')."""
    path = (root / name).resolve()
    return path if path.is_relative_to(root.resolve()) else None


def convert_video_csv(
    csv_path: PathLike,
    video_dir: PathLike,
    out_dir: PathLike,
    *,
    split: str = "train",
    shard_size: int = 1000,
    probe: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """A caption CSV over a video folder to ``{split}-%06d.tar``, one sample a video file.

    The CSV's header names ``file`` (relative to ``video_dir``) and ``caption``; optional
    ``language`` (default "en") and ``split`` (then only rows of ``split`` are used); other
    columns are kept in the json (the first row's values). Several rows of one file are
    several captions. Samples: key = the file's path without extension ('/' and '.' -> '_'),
    the video's bytes under its extension, ``txt`` = the first caption (English if any),
    ``json`` = ``{"file", "captions": {lang: [...]}, ...extra columns}``.
    Skipped and counted (with the file named): missing files, other extensions than
    mp4/webm/mkv, and, with ``probe``, files PyAV cannot open or decode a first frame of.
    """
    _check_common(split, shard_size, video_dir, "video")
    stats = SkipStats(os.fspath(csv_path), "items")
    grouped = _group_csv(csv_path, split, stats)
    root = Path(video_dir)
    keys: dict[str, str] = {}
    bar = progress_bar(grouped.files.items(), desc=f"videos {split}", unit="video",
                       enabled=progress)  # fmt: skip
    with ShardWriter(Path(out_dir) / f"{split}-%06d.tar", shard_size) as writer:
        for name, entry in bar:
            path = _safe_path(root, name)
            ext = None if path is None else _video_ext(path)
            if path is None or ext is None:
                stats.skip("unsupported_file", name, warn=False)
                continue
            if not path.is_file():
                stats.skip("missing_video", name, warn=False)
                continue
            if probe:
                try:
                    probe_video(path)
                except ValueError as exc:
                    stats.skip("unreadable_video", str(exc), warn=False)
                    continue
            key = _key(str(Path(name).with_suffix("")))
            if key in keys:
                stats.skip("duplicate_key", f"{name} (key {key!r} of {keys[key]})", warn=False)
                continue
            keys[key] = name
            record = {**entry["extra"], "file": name, "captions": entry["captions"]}
            caption = _primary_caption(entry["captions"])
            writer.write({"__key__": key, ext: path.read_bytes(), "txt": caption, "json": record})
            stats.written += 1
    _summarise(stats)
    return stats.result(writer.shards)


# ---------------------------------------------------------------------------------------------
# Pre-extracted features


def load_features(path: PathLike) -> np.ndarray:
    """A ``.npy`` of per-frame features [T,F], checked; ValueError naming the file if bad.

    float16 and float32 stay as they are, float64 becomes float32; anything else, another
    shape, an empty array or a NaN/inf is an error.
    """
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"{path}: not a .npy array ({exc})") from None
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{path}: not a single .npy array")
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"{path}: expected features [T,F], got shape {array.shape}")
    if array.dtype not in (np.float16, np.float32, np.float64):
        raise ValueError(f"{path}: expected float16/32/64 features, got {array.dtype}")
    if not np.isfinite(array).all():
        raise ValueError(f"{path}: NaN or inf in the features")
    return np.ascontiguousarray(array, np.float32 if array.dtype == np.float64 else array.dtype)


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def convert_video_features(
    csv_path: PathLike,
    features_dir: PathLike,
    out_dir: PathLike,
    *,
    split: str = "train",
    shard_size: int = 1000,
    progress: bool = False,
) -> dict[str, Any]:
    """A caption CSV over per-video ``.npy`` features to ``{split}-%06d.tar`` (npy, txt, json).

    The CSV is :func:`convert_video_csv`'s; ``file`` names the ``.npy`` (relative to
    ``features_dir``) or the video it was extracted from (``a/clip.mp4`` -> ``a/clip.npy``),
    so one CSV serves both. Bad arrays (see :func:`load_features`) are skipped and counted with
    the file and what is wrong, rather than stopping a long conversion at the first one; so
    are arrays whose F differs from the first written (a shard set has one feature size).
    ``json`` = ``{"file", "captions", "frames": T, "dim": F, ...extra columns}``.
    """
    _check_common(split, shard_size, features_dir, "features")
    stats = SkipStats(os.fspath(csv_path), "items")
    grouped = _group_csv(csv_path, split, stats)
    root = Path(features_dir)
    keys: dict[str, str] = {}
    dim: int | None = None
    bar = progress_bar(grouped.files.items(), desc=f"video features {split}", unit="video",
                       enabled=progress)  # fmt: skip
    with ShardWriter(Path(out_dir) / f"{split}-%06d.tar", shard_size) as writer:
        for name, entry in bar:
            npy_name = (
                name if name.lower().endswith(".npy") else str(Path(name).with_suffix(".npy"))
            )
            path = _safe_path(root, npy_name)
            if path is None:
                stats.skip("unsupported_file", name, warn=False)
                continue
            if not path.is_file():
                stats.skip("missing_features", npy_name, warn=False)
                continue
            try:
                array = load_features(path)
            except ValueError as exc:
                stats.skip("bad_features", str(exc), warn=False)
                continue
            if dim is None:
                dim = array.shape[1]
            elif array.shape[1] != dim:
                stats.skip("wrong_dim", f"{path}: F = {array.shape[1]}, not {dim}", warn=False)
                continue
            key = _key(str(Path(name).with_suffix("")))
            if key in keys:
                stats.skip("duplicate_key", f"{name} (key {key!r} of {keys[key]})", warn=False)
                continue
            keys[key] = name
            record = {
                **entry["extra"],
                "file": name,
                "captions": entry["captions"],
                "frames": int(array.shape[0]),
                "dim": int(array.shape[1]),
            }
            caption = _primary_caption(entry["captions"])
            writer.write({"__key__": key, "npy": _npy_bytes(array), "txt": caption, "json": record})
            stats.written += 1
    _summarise(stats)
    return stats.result(writer.shards, dim=dim)


# --------------------------------------------------------------------------------------------
# mmptm data msrvtt | videos | video-features


def _msrvtt_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--videos", required=True, help="folder of <video_id>.mp4")
    p.add_argument("--annotations", required=True, help="e.g. train_val_videodatainfo.json")
    p.add_argument("--out", required=True)
    p.add_argument("--split", default=default_of(convert_msrvtt, "split"),
                   choices=[*_MSRVTT_SPLITS, "all"])  # fmt: skip
    p.add_argument("--keys", "--test-keys", dest="keys", default=None,
                   help="only these video ids, one a line (e.g. the 1k-A test list)")  # fmt: skip
    p.add_argument("--shard-size", type=int, default=default_of(convert_msrvtt, "shard_size"))
    p.add_argument("--no-progress", action="store_true")


@CONVERTERS.register("msrvtt", "MSR-VTT annotation JSON + video folder", _msrvtt_arguments)
def _msrvtt_command(args: argparse.Namespace) -> int:
    stats = convert_msrvtt(
        args.videos, args.annotations, args.out, split=args.split, keys=args.keys,
        shard_size=args.shard_size, progress=not args.no_progress,
    )  # fmt: skip
    print_stats(stats)
    return 0


def _videos_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--csv", required=True)
    p.add_argument("--video-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--split", default=default_of(convert_video_csv, "split"))
    p.add_argument("--shard-size", type=int, default=default_of(convert_video_csv, "shard_size"))
    p.add_argument("--no-probe", action="store_true",
                   help="do not check that PyAV decodes each file's first frame")  # fmt: skip
    p.add_argument("--no-progress", action="store_true")


@CONVERTERS.register("videos", "caption CSV (file,caption[,language,split])", _videos_arguments)
def _videos_command(args: argparse.Namespace) -> int:
    stats = convert_video_csv(
        args.csv, args.video_dir, args.out, split=args.split, shard_size=args.shard_size,
        probe=not args.no_probe, progress=not args.no_progress,
    )  # fmt: skip
    print_stats(stats)
    return 0


def _features_arguments(p: argparse.ArgumentParser) -> None:
    fn = convert_video_features
    p.add_argument("--csv", required=True)
    p.add_argument("--features-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--split", default=default_of(fn, "split"))
    p.add_argument("--shard-size", type=int, default=default_of(fn, "shard_size"))
    p.add_argument("--no-progress", action="store_true")


@CONVERTERS.register("video-features", "caption CSV + per-video .npy [T,F]", _features_arguments)
def _features_command(args: argparse.Namespace) -> int:
    stats = convert_video_features(
        args.csv, args.features_dir, args.out, split=args.split, shard_size=args.shard_size,
        progress=not args.no_progress,
    )  # fmt: skip
    print_stats(stats)
    return 0
