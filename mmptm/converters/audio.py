"""Converters from the layouts audio corpora ship in to webdataset shards.

Readers for Clotho (``clotho_captions_<split>.csv`` + its wav folder), AudioCaps
(``<split>.csv`` + a folder of downloaded clips named by YouTube id), ESC-50 (``meta/esc50
.csv`` + ``audio/``; one shard set per fold) and LibriSpeech (``<spk>/<chap>/`` folders of
``.flac`` with a ``.trans.txt``). Shard members, one sample per clip:

- ``flac``: the audio. A flac file is copied byte for byte; anything else (wav, mp3, m4a,
  ...) is decoded with :func:`~mmptm.modalities.audio_io.read_audio` (mono) and written as
  16-bit flac at its own rate. ``sample_rate`` resamples on the way (a flac at another rate is
  then re-encoded too).
- ``json``: ``key``, what the corpus says about the clip (``captions`` {"en": [...]},
  ``label``/``category``/``fold``, ``transcript``/``speaker``/``chapter``), plus the stored
  audio's ``sample_rate`` and ``duration`` (seconds).
- ``txt``: the first caption (Clotho, AudioCaps) or the transcript (LibriSpeech).

Bad input never stops a conversion and is never dropped silently. Audio files that are named
but absent are ``missing_audio``: counted, and all of them listed in a text file beside the
shards (``<split>-missing.txt``; ESC-50: ``missing.txt``), since a download can miss
thousands. Files that cannot be decoded are ``unreadable_audio``: logged one line each,
naming the file and the decoder's complaint. CSV rows with another number of fields than the
header (or unusable values) are skipped and counted with ``file:line``; a CSV the csv module
cannot parse (an unclosed quote, a NUL byte) or a header without the needed columns is an
error naming the file and line. Every converter returns ``{"written", "skipped": {reason: n},
"skipped_items": {reason: [what, ...]}, "shards", "missing", "missing_list", ...}`` like the
image and video converters; samples come in a fixed order (the CSV's, or sorted folders), so
the same input gives byte-identical shards.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mmptm.converters import print_stats
from mmptm.converters.text import SkipStats
from mmptm.data.shards import ShardWriter
from mmptm.modalities.audio_io import (
    AUDIO_MEMBERS,
    audio_info,
    encode_audio,
    read_audio,
    resample,
)
from mmptm.progress import progress_bar
from mmptm.registry import CONVERTERS, default_of

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "convert_audiocaps",
    "convert_clotho",
    "convert_esc50",
    "convert_librispeech",
    "flac_member",
    "format_summary",
]

log = logging.getLogger(__name__)
PathLike = str | os.PathLike[str]

#: clips per shard: ~50 MB of LibriSpeech, ~400 MB of 30 s Clotho clips at 44.1 kHz; enough
#: shards for every loader worker of a multi-GPU run even on ESC-50's 400-clip folds
DEFAULT_SHARD_SIZE = 256
_CODE = re.compile(r"[A-Za-z0-9_-]+")  # a split goes into file names
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_CAPTION_COLUMN = re.compile(r"caption_([0-9]+)")  # Clotho: caption_1 ... caption_5


# ---------------------------------------------------------------------------------------------
# Shared parts


def flac_member(
    path: PathLike, *, sample_rate: int | None = None, probe: bool = True
) -> tuple[bytes, dict[str, Any]]:
    """An audio file as ``flac`` bytes plus ``{"sample_rate", "duration"}`` of what is stored.

    A flac already at ``sample_rate`` (or any flac when it is None) is returned as it is,
    after decoding it whole when ``probe`` (a truncated file or NaN samples show only then;
    without, only its header is read). Other files are decoded to mono, resampled when
    ``sample_rate`` differs, and encoded as 16-bit flac. ``ValueError`` naming the file when
    it cannot be read or decoded.
    """
    where = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    ext = Path(path).suffix.lower().lstrip(".")
    if ext == "flac":
        duration, rate = audio_info(data, "flac", where)
        if sample_rate is None or sample_rate == rate:
            if probe:
                wave_S, _ = read_audio(data, "flac", where)
                duration = len(wave_S) / rate
            elif duration <= 0:
                raise ValueError(f"{where}: no audio samples")
            return data, {"sample_rate": rate, "duration": round(duration, 6)}
    wave_S, rate = read_audio(data, ext, where)
    if sample_rate is not None and sample_rate != rate:
        wave_S, rate = resample(wave_S, rate, sample_rate), sample_rate
    return encode_audio(wave_S, rate, "flac"), {
        "sample_rate": rate,
        "duration": round(len(wave_S) / rate, 6),
    }


def _key(text: str) -> str:
    """A shard key from a file name or id: no '.' or '/' (webdataset splits names on them)."""
    return _KEY_UNSAFE.sub("_", text) or "_"


def _check_common(
    split: str, shard_size: int, folder: PathLike, what: str, sample_rate: int | None
) -> None:
    if not isinstance(split, str) or not _CODE.fullmatch(split):
        raise ValueError(f"invalid split {split!r}: use letters, digits, '_' or '-'")
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    if sample_rate is not None and sample_rate <= 0:
        raise ValueError(f"sample_rate must be > 0, got {sample_rate}")
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder}: {what} folder not found")


def _split_from(path: PathLike, prefix: str) -> str:
    """The split a file is named after: ``clotho_captions_development.csv`` -> development."""
    stem = Path(path).stem
    split = stem[len(prefix) :] if stem.startswith(prefix) else stem
    if not _CODE.fullmatch(split):
        raise ValueError(f"{path}: cannot tell the split from the file name; pass --split")
    return split


def _read_csv(
    path: PathLike, required: Sequence[str]
) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """The header and (line, {column: stripped value}) per row; a row with another number of
    fields than the header comes as (line, {}). Caption CSVs are small: read whole."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    rows: list[tuple[int, dict[str, str]]] = []
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, strict=True)  # strict: an unclosed quote must not eat the file
        try:
            header = [h.strip() for h in next(reader, [])]
            missing = [c for c in required if c not in header]
            if missing:
                raise ValueError(f"{path}: the header lacks {missing}, got {header}")
            for row in reader:
                if not row or row == [""]:
                    continue  # blank line
                fields = zip(header, row) if len(row) == len(header) else ()
                rows.append((reader.line_num, {k: v.strip() for k, v in fields}))
        except csv.Error as exc:
            raise ValueError(f"{path}:{reader.line_num}: not a readable CSV ({exc})") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 ({exc})") from None
    return header, rows


def _number(text: str) -> int | float:
    """An int when integral ('30', '30.0'), else a float; ValueError when not a number."""
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"not a finite number: {text!r}")
    return int(value) if value.is_integer() else value


class _Clips:
    """Turns the clips of one conversion into samples: audio, unique keys, skips, missing list.

    ``missing`` keeps every missing item (for the list file), unlike ``SkipStats``, which keeps
    the first hundred per reason.
    """

    def __init__(self, stats: SkipStats, sample_rate: int | None, probe: bool) -> None:
        self.stats = stats
        self.sample_rate = sample_rate
        self.probe = probe
        self.missing: list[str] = []
        self.keys: set[str] = set()

    def audio(self, path: Path | None, name: str) -> tuple[bytes, dict[str, Any]] | None:
        """(flac, audio facts) of ``path``, or None after counting why not."""
        if path is None or not path.is_file():
            self.miss(name)
            return None
        try:
            return flac_member(path, sample_rate=self.sample_rate, probe=self.probe)
        except ValueError as exc:
            self.stats.skip("unreadable_audio", str(exc), warn=False)
            log.warning("skipped (unreadable_audio): %s", exc)
            return None

    def miss(self, name: str) -> None:
        self.missing.append(name)
        self.stats.skip("missing_audio", name, warn=False)

    def key(self, text: str) -> str:
        """A key from ``text``, suffixed ``_2``, ``_3``... when sanitising made it collide."""
        base = key = _key(text)
        n = 1
        while key in self.keys:
            n += 1
            key = f"{base}_{n}"
        self.keys.add(key)
        return key

    def finish(self, missing_list: Path, shards: list[str], **extra: Any) -> dict[str, Any]:
        """Write the missing list (empty when nothing is missing) and build the result."""
        missing_list.parent.mkdir(parents=True, exist_ok=True)
        missing_list.write_text("".join(f"{m}\n" for m in self.missing), encoding="utf-8")
        if self.missing:
            log.warning("%s: %d missing audio files, listed in %s", self.stats.source,
                        len(self.missing), missing_list)  # fmt: skip
        for reason, n in self.stats.skipped.items():
            if reason not in ("missing_audio", "unreadable_audio"):
                where = self.stats.where.get(reason, [])[:10]
                shown = ", ".join(f"line {w}" if isinstance(w, int) else w for w in where)
                log.warning("%s: skipped %d (%s): %s", self.stats.source, n, reason, shown)
        return self.stats.result(
            shards, missing=len(self.missing), missing_list=os.fspath(missing_list), **extra
        )


def format_summary(name: str, out_dir: PathLike, result: dict[str, Any]) -> str:
    """One line for the command line: written, skipped per reason, where the missing are."""
    skipped = result.get("skipped") or {}
    line = f"{name} → {out_dir}: wrote {result['written']} clips in {len(result['shards'])} shards"
    if skipped:
        reasons = ", ".join(f"{k} {v}" for k, v in skipped.items())
        line += f"; skipped {sum(skipped.values())} ({reasons})"
    else:
        line += "; skipped nothing"
    if result.get("missing"):
        line += f"; missing listed in {result['missing_list']}"
    return line


# ---------------------------------------------------------------------------------------------
# Clotho


def convert_clotho(
    csv_path: PathLike,
    audio_dir: PathLike,
    out_dir: PathLike,
    *,
    split: str | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    sample_rate: int | None = None,
    probe: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Clotho's ``clotho_captions_<split>.csv`` + its audio folder to ``{split}-%06d.tar``.

    Columns ``file_name, caption_1 ... caption_5`` (captions quoted when they hold commas);
    ``split`` defaults to the CSV's name (development, validation, evaluation). Samples, in
    CSV order: key = the file name without extension (unsafe characters -> '_'), ``flac``,
    ``txt`` = caption_1, ``json`` = ``{"key", "file_name", "captions": {"en": [5]},
    "sample_rate", "duration"}``. Empty caption cells are dropped (a row with none left is
    skipped as ``no_captions``); a file named twice is ``duplicate_file``.
    """
    split = split or _split_from(csv_path, "clotho_captions_")
    _check_common(split, shard_size, audio_dir, "audio", sample_rate)
    stats = SkipStats(os.fspath(csv_path), "items")
    rows: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    header, table = _read_csv(csv_path, ("file_name", "caption_1"))
    numbered = [(int(m.group(1)), c) for c in header if (m := _CAPTION_COLUMN.fullmatch(c))]
    columns = [c for _, c in sorted(numbered)]
    for line, row in table:
        if not row or not row["file_name"]:
            stats.skip("malformed", line)
            continue
        if row["file_name"] in seen:
            stats.skip("duplicate_file", f"line {line}: {row['file_name']}", warn=False)
            continue
        captions = [row[c] for c in columns if row[c]]
        if not captions:
            stats.skip("no_captions", f"line {line}: {row['file_name']}", warn=False)
            continue
        seen.add(row["file_name"])
        rows.append((row["file_name"], captions))
    root = Path(audio_dir)
    clips = _Clips(stats, sample_rate, probe)
    pattern = Path(out_dir) / f"{split}-%06d.tar"
    with (
        ShardWriter(pattern, shard_size) as writer,
        progress_bar(total=len(rows), desc=f"clotho {split}", unit="clip", enabled=progress) as bar,
    ):
        for name, captions in rows:
            bar.update()
            got = clips.audio(_inside(root, name), name)
            if got is None:
                continue
            flac, facts = got
            key = clips.key(Path(name).stem)
            record = {"key": key, "file_name": name, "captions": {"en": captions}, **facts}
            writer.write({"__key__": key, "flac": flac, "txt": captions[0], "json": record})
            stats.written += 1
    return clips.finish(Path(out_dir) / f"{split}-missing.txt", writer.shards)


def _inside(root: Path, name: str) -> Path | None:
    """``root / name`` unless ``name`` escapes ``root`` (absolute, or through '..')."""
    path = (root / name).resolve()
    return path if path.is_relative_to(root.resolve()) else None


# ---------------------------------------------------------------------------------------------
# AudioCaps


class _AudioFolder:
    """A flat folder of downloads, found by id: ``<id>.<ext>`` or ``<id>_<anything>.<ext>``.

    Downloaders name clips ``<youtube_id>.wav``, ``<youtube_id>_<start>.m4a`` or
    ``<youtube_id>_<start>_<end>.flac``; YouTube ids themselves may hold '_', so each file is
    indexed under every prefix of its stem that ends before a '_'.
    """

    def __init__(self, folder: Path) -> None:
        self.stems: dict[str, list[Path]] = {}
        self.prefixed: dict[str, set[str]] = {}
        for path in sorted(folder.iterdir()):
            stem, dot, ext = path.name.rpartition(".")
            if not dot or ext.lower() not in AUDIO_MEMBERS or not path.is_file():
                continue  # also skips yt-dlp's .part and .info.json leftovers
            self.stems.setdefault(stem, []).append(path)
            for i, ch in enumerate(stem):
                if ch == "_" and i > 0:
                    self.prefixed.setdefault(stem[:i], set()).add(stem)

    def find(self, ident: str, start: int | float | None) -> Path | list[str] | None:
        """The file of ``ident`` (flac first, then AUDIO_MEMBERS order), None when there is
        none, or the candidate stems when several clips could be it."""
        stems = [ident] if ident in self.stems else sorted(self.prefixed.get(ident, ()))
        if len(stems) > 1 and start is not None:
            at_start = [s for s in stems if _starts_at(s[len(ident) + 1 :], start)]
            stems = at_start or stems
        if not stems:
            return None
        if len(stems) > 1:
            return stems
        order = {ext: i for i, ext in enumerate(AUDIO_MEMBERS)}
        return min(self.stems[stems[0]], key=lambda p: order[p.suffix.lower().lstrip(".")])


def _starts_at(rest: str, start: int | float) -> bool:
    """Whether a file name's suffix after the id begins with ``start`` in seconds or ms."""
    try:
        value = float(rest.split("_", 1)[0])
    except ValueError:
        return False
    return value in (start, start * 1000)


def convert_audiocaps(
    csv_path: PathLike,
    audio_dir: PathLike,
    out_dir: PathLike,
    *,
    split: str | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    sample_rate: int | None = None,
    probe: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """AudioCaps' ``<split>.csv`` + a folder of its downloaded clips to ``{split}-%06d.tar``.

    Columns ``audiocap_id, youtube_id, start_time, caption`` (only youtube_id and caption are
    required); the rows of one youtube_id (1 in train, 5 in val/test) become one sample, in
    order of first appearance. Clips are found by :class:`_AudioFolder` (any audio
    extension). Samples: key = youtube_id, ``flac``, ``txt`` = the first caption, ``json`` =
    ``{"key", "youtube_id", "start_time", "audiocap_ids", "captions": {"en": [...]}, "file",
    "sample_rate", "duration"}``. ``split`` defaults to the CSV's name. Skipped and counted:
    rows with a non-numeric start_time or empty id/caption (``malformed``), rows whose
    start_time differs from the id's first row (``other_start_time``), ids with no clip
    (``missing_audio``, listed as ``youtube_id<TAB>start_time`` in ``{split}-missing.txt``)
    or several candidate clips (``ambiguous_audio``).
    """
    split = split or _split_from(csv_path, "")
    _check_common(split, shard_size, audio_dir, "audio", sample_rate)
    stats = SkipStats(os.fspath(csv_path), "items")
    groups: dict[str, dict[str, Any]] = {}
    for line, row in _read_csv(csv_path, ("youtube_id", "caption"))[1]:
        ident, caption = row.get("youtube_id"), row.get("caption")
        try:
            start = _number(row["start_time"]) if row.get("start_time") else None
        except ValueError:
            start, ident = None, None
        if not ident or not caption:
            stats.skip("malformed", line)
            continue
        group = groups.setdefault(ident, {"start_time": start, "audiocap_ids": [], "captions": []})
        if group["start_time"] != start:
            stats.skip("other_start_time", line)
            continue
        cap_id = row.get("audiocap_id", "")
        group["audiocap_ids"].append(int(cap_id) if cap_id.isdigit() else cap_id or None)
        group["captions"].append(caption)
    folder = _AudioFolder(Path(audio_dir))
    clips = _Clips(stats, sample_rate, probe)
    with (
        ShardWriter(Path(out_dir) / f"{split}-%06d.tar", shard_size) as writer,
        progress_bar(
            total=len(groups), desc=f"audiocaps {split}", unit="clip", enabled=progress
        ) as bar,
    ):
        for ident, group in groups.items():
            bar.update()
            found = folder.find(ident, group["start_time"])
            if isinstance(found, list):
                stats.skip("ambiguous_audio", f"{ident}: {', '.join(found)}", warn=False)
                continue
            start = "" if group["start_time"] is None else group["start_time"]
            got = clips.audio(found, f"{ident}\t{start}")
            if got is None:
                continue
            assert found is not None
            flac, facts = got
            key = clips.key(ident)
            record = {"key": key, "youtube_id": ident, **group, "file": found.name, **facts}
            captions = group["captions"]
            record["captions"] = {"en": captions}
            writer.write({"__key__": key, "flac": flac, "txt": captions[0], "json": record})
            stats.written += 1
    return clips.finish(Path(out_dir) / f"{split}-missing.txt", writer.shards)


# ---------------------------------------------------------------------------------------------
# ESC-50


def convert_esc50(
    root: PathLike,
    out_dir: PathLike,
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    sample_rate: int | None = None,
    probe: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """ESC-50 (``meta/esc50.csv`` + ``audio/``) to one shard set per fold, plus ``labels.txt``.

    ``meta/esc50.csv``: ``filename, fold, target, category[, esc10, src_file, take]``.
    Writes ``fold<k>/fold<k>-%06d.tar`` for each fold (folds in order, clips in CSV order),
    so the 5-fold protocol is a shard pattern: train on ``fold{1,2,3,4}/*.tar``, test on
    ``fold5/*.tar`` (or ``mmptm eval probe --folds DIR/fold1 ... DIR/fold5``). Samples: key =
    the file name without extension, ``flac``, ``json`` = ``{"key", "filename", "label":
    target, "category", "fold", "esc10", "src_file", "take", "sample_rate", "duration"}``
    (the optional columns when the CSV has them). ``labels.txt``: the category of target i on
    line i + 1 (the label plug-in's ``names``). Rows with a non-integer fold or target, or
    empty filename or category, are skipped (``malformed``); a target named by two
    categories, or targets that are not 0..K-1, is an error, as the label names would be
    wrong.
    """
    root = Path(root)
    meta, audio = root / "meta" / "esc50.csv", root / "audio"
    _check_common("esc50", shard_size, audio, "audio", sample_rate)
    stats = SkipStats(os.fspath(meta), "items")
    names: dict[int, tuple[str, int]] = {}  # target -> (category, line that named it)
    folds: dict[int, list[dict[str, Any]]] = {}
    for line, row in _read_csv(meta, ("filename", "fold", "target", "category"))[1]:
        try:
            fold, target = int(row["fold"]), int(row["target"])
        except (KeyError, ValueError):
            fold = target = -1
        if fold < 1 or target < 0 or not row.get("filename") or not row.get("category"):
            stats.skip("malformed", line)
            continue
        category, first = names.setdefault(target, (row["category"], line))
        if category != row["category"]:
            raise ValueError(f"{meta}:{line}: target {target} is {row['category']!r} here but "
                             f"{category!r} on line {first}")  # fmt: skip
        record = {"filename": row["filename"], "label": target, "category": category}
        record["fold"] = fold
        if "esc10" in row:
            record["esc10"] = row["esc10"].lower() == "true"
        record |= {k: row[k] for k in ("src_file", "take") if k in row}
        folds.setdefault(fold, []).append(record)
    gaps = sorted(set(range(max(names, default=-1) + 1)) - names.keys())
    if gaps:
        raise ValueError(f"{meta}: targets must be 0..K-1; no row names target(s) {gaps}")
    out = Path(out_dir)
    labels = out / "labels.txt"
    out.mkdir(parents=True, exist_ok=True)
    labels.write_text("".join(f"{names[i][0]}\n" for i in range(len(names))), encoding="utf-8")
    clips = _Clips(stats, sample_rate, probe)
    shards: list[str] = []
    per_fold: dict[str, dict[str, Any]] = {}
    total = sum(len(v) for v in folds.values())
    with progress_bar(total=total, desc="esc50", unit="clip", enabled=progress) as bar:
        for fold in sorted(folds):
            name = f"fold{fold}"
            written = stats.written
            with ShardWriter(out / name / f"{name}-%06d.tar", shard_size) as writer:
                for record in folds[fold]:
                    bar.update()
                    got = clips.audio(_inside(audio, record["filename"]), record["filename"])
                    if got is None:
                        continue
                    key = clips.key(Path(record["filename"]).stem)
                    flac, facts = got
                    writer.write({"__key__": key, "flac": flac,
                                  "json": {"key": key, **record, **facts}})  # fmt: skip
                    stats.written += 1
            per_fold[name] = {"written": stats.written - written, "shards": writer.shards}
            shards += writer.shards
    return clips.finish(
        out / "missing.txt", shards, folds=per_fold, labels=os.fspath(labels), classes=len(names)
    )


# ---------------------------------------------------------------------------------------------
# LibriSpeech


def _numeric_first(paths: Iterable[Path]) -> list[Path]:
    """Folders in numeric order of their names (LibriSpeech's speaker and chapter ids)."""
    return sorted(paths, key=lambda p: (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name))


def _read_transcripts(path: Path, stats: SkipStats) -> dict[str, str]:
    """``UTT-ID TRANSCRIPT`` lines; malformed and repeated ids are skipped and counted."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 ({exc})") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        utt, _, transcript = line.strip().partition(" ")
        transcript = transcript.strip()
        if not transcript or not _CODE.fullmatch(utt):
            stats.skip("malformed", f"{path}:{n}")
        elif utt in out:
            stats.skip("duplicate_utterance", f"{path}:{n}")
        else:
            out[utt] = transcript
    return out


def convert_librispeech(
    root: PathLike,
    out_dir: PathLike,
    *,
    split: str | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    sample_rate: int | None = None,
    probe: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """A LibriSpeech subset (``LibriSpeech/train-clean-100``) to ``{split}-%06d.tar``.

    Layout: ``<root>/<speaker>/<chapter>/`` holding ``<spk>-<chap>-<utt>.flac`` and
    ``<spk>-<chap>.trans.txt`` (lines ``UTT-ID TRANSCRIPT``). ``split`` defaults to the
    subset's folder name. Samples, by speaker, chapter and utterance id: key = the utterance
    id, ``flac`` (copied), ``txt`` = the transcript as given (upper case, no punctuation, as
    LibriSpeech ships it), ``json`` = ``{"key", "transcript", "speaker", "chapter",
    "sample_rate", "duration"}`` (speaker and chapter as the folder names, strings). Counted:
    audio without a transcript line (``no_transcript``), transcript lines without audio
    (``missing_audio``, the utterance ids listed in ``{split}-missing.txt``), malformed or
    repeated transcript lines (``file:line``).
    """
    root = Path(root)
    split = split or root.resolve().name
    _check_common(split, shard_size, root, "LibriSpeech subset", sample_rate)
    stats = SkipStats(os.fspath(root), "items")
    utterances: list[tuple[str, str, str, Path | None, str | None]] = []
    n_transcripts = 0
    for speaker in _numeric_first(p for p in root.iterdir() if p.is_dir()):
        for chapter in _numeric_first(p for p in speaker.iterdir() if p.is_dir()):
            transcripts: dict[str, str] = {}
            for trans in sorted(chapter.glob("*.trans.txt")):
                n_transcripts += 1
                for utt, text in _read_transcripts(trans, stats).items():
                    if utt in transcripts:
                        stats.skip("duplicate_utterance", f"{trans}: {utt}")
                    else:
                        transcripts[utt] = text
            audio: dict[str, Path] = {}
            order = {ext: i for i, ext in enumerate(AUDIO_MEMBERS)}
            for path in sorted(chapter.iterdir(), key=lambda p: p.name):
                stem, dot, ext = path.name.rpartition(".")
                if dot and ext.lower() in order and path.is_file():
                    best = audio.setdefault(stem, path)
                    if order[ext.lower()] < order[best.suffix.lower().lstrip(".")]:
                        audio[stem] = path  # flac before wav before ...
            for utt in sorted(transcripts.keys() | audio.keys()):
                utterances.append(
                    (utt, speaker.name, chapter.name, audio.get(utt), transcripts.get(utt))
                )
    if not n_transcripts:
        raise ValueError(
            f"{root}: no <speaker>/<chapter>/*.trans.txt found; --root must be a subset folder "
            "such as LibriSpeech/train-clean-100"
        )
    clips = _Clips(stats, sample_rate, probe)
    with (
        ShardWriter(Path(out_dir) / f"{split}-%06d.tar", shard_size) as writer,
        progress_bar(
            total=len(utterances), desc=f"librispeech {split}", unit="clip", enabled=progress
        ) as bar,
    ):
        for utt, speaker_id, chapter_id, path, transcript in utterances:
            bar.update()
            if transcript is None:
                stats.skip("no_transcript", os.fspath(path), warn=False)
                continue
            got = clips.audio(path, utt)
            if got is None:
                continue
            flac, facts = got
            key = clips.key(utt)
            record = {"key": key, "transcript": transcript, "speaker": speaker_id}
            record |= {"chapter": chapter_id, **facts}
            writer.write({"__key__": key, "flac": flac, "txt": transcript, "json": record})
            stats.written += 1
    return clips.finish(Path(out_dir) / f"{split}-missing.txt", writer.shards)


# ---------------------------------------------------------------------------------------------
# mmptm data clotho | audiocaps | esc50 | librispeech


def _common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="shard folder")
    p.add_argument("--shard-size", type=int, default=default_of(convert_clotho, "shard_size"),
                   help=f"clips (default {DEFAULT_SHARD_SIZE})")  # fmt: skip
    p.add_argument("--sample-rate", type=int, default=default_of(convert_clotho, "sample_rate"),
                   help="resample to this rate (default: keep each file's)")  # fmt: skip
    p.add_argument("--no-probe", action="store_true",
                   help="copy flac files after reading their header only "
                        "(default: decode each whole to find broken ones)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true")


def _csv_arguments(p: argparse.ArgumentParser) -> None:
    _common_arguments(p)
    p.add_argument("--csv", required=True)
    p.add_argument("--audio-dir", required=True)
    p.add_argument("--split", default=None,
                   help="shard name prefix (default: from the CSV file name)")  # fmt: skip


def _root_arguments(p: argparse.ArgumentParser) -> None:
    _common_arguments(p)
    p.add_argument("--root", required=True, help="e.g. ESC-50-master, "
                   "LibriSpeech/train-clean-100")  # fmt: skip


def _librispeech_arguments(p: argparse.ArgumentParser) -> None:
    _root_arguments(p)
    p.add_argument("--split", default=None,
                   help="shard name prefix (default: from the root folder name)")  # fmt: skip


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return dict(shard_size=args.shard_size, sample_rate=args.sample_rate,
                probe=not args.no_probe, progress=not args.no_progress)  # fmt: skip


def _report(name: str, args: argparse.Namespace, stats: dict[str, Any]) -> int:
    print(format_summary(name, args.out, stats))
    print_stats(stats)
    return 0


@CONVERTERS.register(
    "clotho", "Clotho: clotho_captions_<split>.csv + its audio folder", _csv_arguments
)
def _clotho_command(args: argparse.Namespace) -> int:
    stats = convert_clotho(args.csv, args.audio_dir, args.out, split=args.split, **_options(args))
    return _report("clotho", args, stats)


@CONVERTERS.register(
    "audiocaps", "AudioCaps: <split>.csv + a folder of clips named by youtube_id", _csv_arguments
)
def _audiocaps_command(args: argparse.Namespace) -> int:
    stats = convert_audiocaps(args.csv, args.audio_dir, args.out, split=args.split,
                              **_options(args))  # fmt: skip
    return _report("audiocaps", args, stats)


@CONVERTERS.register(
    "esc50", "ESC-50: meta/esc50.csv + audio/ → fold1/ ... fold5/ + labels.txt", _root_arguments
)
def _esc50_command(args: argparse.Namespace) -> int:
    return _report("esc50", args, convert_esc50(args.root, args.out, **_options(args)))


@CONVERTERS.register(
    "librispeech", "LibriSpeech subset: <spk>/<chap>/*.flac + *.trans.txt",
    _librispeech_arguments,
)  # fmt: skip
def _librispeech_command(args: argparse.Namespace) -> int:
    stats = convert_librispeech(args.root, args.out, split=args.split, **_options(args))
    return _report("librispeech", args, stats)
