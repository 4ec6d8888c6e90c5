"""Converters from the formats vision-language corpora ship in to webdataset shards.

Readers for COCO captions JSON (+ the image folder), Karpathy's caption splits (COCO,
Flickr8k, Flickr30k), VQA v2 questions/annotations JSON and bottom-up-attention region
features (the BUTD / LXMERT TSV). Shard members:

- image-text (img2dataset convention): ``jpg``, ``txt`` (the caption), ``json`` =
  ``{"image_id", "caption_id", "file_name", "width", "height", "captions": {"en": ...}}``
- Karpathy splits: one sample an image, ``txt`` the first caption, ``json.captions =
  {"en": [every caption]}`` (the references captioning is scored against)
- VQA: ``jpg`` and/or ``regions.npz``, ``json`` = ``{"question", "question_id", "image_id",
  "answers": [10 raw strings], "answer_type", "question_type", "multiple_choice_answer"}``;
  unannotated (test) questions have ``"answers": []`` and no types
- ``regions.npz`` (both, when region features are given): ``features`` float32 [R,F],
  ``boxes`` float32 [R,4] (x1, y1, x2, y2 normalised to [0, 1]), ``image_size`` int32 [2]
  (w, h), optional ``probs`` float32 [R,C] and ``labels`` int64 [R]; written by
  :func:`~mmptm.modalities.regions.regions_npz_bytes` (the regions plug-in owns the format)
  with fixed zip headers, so the same arrays give the same bytes.

A converter needs every source it is given: with ``regions_tsv``, an image without region
features is skipped (and counted), so that all samples of a shard set have the same members.
Every converter returns ``{"written": n, "skipped": {reason: n}, "skipped_items": {reason:
[what, ...]}, "shards": [...]}``, naming the file, caption id or question id of each skip
(``duplicate_regions`` counts TSV rows, not samples: the first row of an image is used).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import csv
import io
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from mmptm.converters import print_stats, shard_arguments
from mmptm.converters.text import SkipStats
from mmptm.data.shards import ShardWriter
from mmptm.modalities.regions import REGION_ARRAYS, load_regions, regions_npz_bytes
from mmptm.progress import progress_bar
from mmptm.registry import CONVERTERS

__all__ = [
    "BUTD_FIELDS",
    "KARPATHY_SPLITS",
    "LXMERT_FIELDS",
    "REGION_ARRAYS",
    "VQA_IMAGE_NAME",
    "convert_coco_captions",
    "convert_karpathy",
    "convert_vqa",
    "load_regions",
    "read_butd_tsv",
    "regions_npz_bytes",
    "write_butd_tsv",
]

log = logging.getLogger(__name__)
PathLike = str | os.PathLike[str]

# The column layouts in use; the files carry no header, so the column count tells them apart.
# fmt: off
LXMERT_FIELDS = ("img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id",
                 "attrs_conf", "num_boxes", "boxes", "features")
BUTD_FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
# fmt: on
# COCO's names; data_subtype comes from the questions file ("train2014", "test2015"...),
# else it is f"{split}2014"
VQA_IMAGE_NAME = "COCO_{data_subtype}_{image_id:012d}.jpg"
_MAX_ITEMS = 100  # skipped items kept (and warned about) per reason
_CODE = re.compile(r"[A-Za-z0-9_-]+")  # a split goes into file names
_COCO_ID = re.compile(r"COCO_[A-Za-z]+[0-9]*_0*([0-9]+)")  # LXMERT's img_id for COCO images
_JPEG_MAGIC = b"\xff\xd8\xff"
_JPEG_QUALITY = 95  # only for images that were not JPEGs to begin with
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")  # webdataset splits member names at '.' and '/'
#: Karpathy's split of an image -> the shards it goes to: restval (COCO val2014 images
#: outside Karpathy's val and test) trains, as in every captioning paper since
KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


# ---------------------------------------------------------------------------------------------
# regions.npz


# ---------------------------------------------------------------------------------------------
# Bottom-up-attention TSV


def _raise_field_size_limit() -> None:
    # one row holds R x 2048 base64'd floats, far over csv's default limit of 128 KiB;
    # 2**31 - 1 because a C long is 32 bits on Windows
    if csv.field_size_limit() < 2**31 - 1:
        csv.field_size_limit(2**31 - 1)


def _decode(text: str, dtype: type, shape: tuple[int, ...], name: str) -> np.ndarray:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{name}: bad base64 ({exc})") from None
    itemsize = np.dtype(dtype).itemsize
    if len(raw) % itemsize:
        raise ValueError(f"{name}: {len(raw)} bytes is not a whole number of {np.dtype(dtype)}")
    array = np.frombuffer(raw, dtype=dtype)
    try:
        return array.reshape(shape).copy()  # copy: frombuffer's arrays are read-only
    except ValueError:
        raise ValueError(f"{name}: {array.size} values do not fit shape {shape}") from None


def _image_id(text: str) -> int | str:
    text = text.strip()
    return int(text) if text.isdigit() else text


def _match_id(image_id: Any) -> int | str:
    """The id that joins region features to images: LXMERT names COCO images by file stem."""
    if isinstance(image_id, str):
        m = _COCO_ID.fullmatch(image_id)
        if m:
            return int(m.group(1))
        return int(image_id) if image_id.isdigit() else image_id
    return int(image_id)


def _parse_butd_row(row: list[str]) -> dict[str, Any]:
    """One TSV row to a region record; ValueError says what is wrong with it."""
    if len(row) == len(LXMERT_FIELDS):
        f = dict(zip(LXMERT_FIELDS, row))
        ident, width, height = f["img_id"], f["img_w"], f["img_h"]
    elif len(row) == len(BUTD_FIELDS):
        f = dict(zip(BUTD_FIELDS, row))
        ident, width, height = f["image_id"], f["image_w"], f["image_h"]
    else:
        raise ValueError(
            f"{len(row)} columns; expected {len(LXMERT_FIELDS)} (LXMERT) "
            f"or {len(BUTD_FIELDS)} (bottom-up-attention)"
        )
    try:
        w, h, r = int(float(width)), int(float(height)), int(f["num_boxes"])
    except ValueError:
        raise ValueError(f"non-numeric size or num_boxes: {width!r} {height!r}") from None
    if w <= 0 or h <= 0 or r <= 0 or not ident.strip():
        raise ValueError(f"empty image id, size {w}x{h} or {r} boxes")
    features = _decode(f["features"], np.float32, (r, -1), "features")
    if features.shape[1] == 0:
        raise ValueError("features: zero-width feature vectors")
    boxes = _decode(f["boxes"], np.float32, (r, 4), "boxes")
    labels = _decode(f["objects_id"], np.int64, (r,), "objects_id") if "objects_id" in f else None
    if not np.isfinite(features).all() or not np.isfinite(boxes).all():
        raise ValueError("non-finite features or boxes")
    scale = np.array([w, h, w, h], dtype=np.float32)
    return {
        "image_id": _image_id(ident),
        "features": features,
        "boxes": np.clip(boxes / scale, 0.0, 1.0),
        "image_size": np.array([w, h], dtype=np.int32),
        "labels": labels,
        "probs": None,  # the TSVs keep only the arg-max class (and its confidence)
    }


def read_butd_tsv(path: PathLike, *, stats: dict[str, Any] | None = None) -> Iterator[dict]:
    """Region records of a bottom-up-attention TSV (LXMERT's 10 or BUTD's 6 columns).

    Yields ``{"image_id", "features" [R,F], "boxes" [R,4] normalised by the image size,
    "image_size" (w, h), "labels" (LXMERT's objects_id, else None), "probs": None}``.
    Malformed rows are skipped; pass ``stats`` (a dict) to get ``read``, ``skipped`` and
    ``skipped_lines`` counts filled in.
    """
    _raise_field_size_limit()
    stats = {} if stats is None else stats
    stats.update(read=0, skipped={}, skipped_lines={})
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:  # a NUL byte or similar: the row is lost, not the file
                _skip_row(stats, path, reader.line_num, f"unreadable row ({exc})")
                continue
            if not row:
                continue
            try:
                record = _parse_butd_row(row)
            except ValueError as exc:
                _skip_row(stats, path, reader.line_num, str(exc))
                continue
            stats["read"] += 1
            yield record


def _skip_row(stats: dict[str, Any], path: PathLike, line: int, why: str) -> None:
    stats["skipped"]["malformed"] = stats["skipped"].get("malformed", 0) + 1
    lines = stats["skipped_lines"].setdefault("malformed", [])
    if len(lines) < _MAX_ITEMS:
        lines.append(line)
        log.warning("%s:%d: skipped (malformed: %s)", path, line, why)


def _b64(array: np.ndarray, dtype: type) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


def write_butd_tsv(path: PathLike, records: Iterable[Mapping[str, Any]], *, layout: str) -> int:
    """Write region records as a ``"lxmert"`` or ``"butd"`` TSV (boxes back in pixels).

    For exporting features to tools that read these files; returns the number of rows.
    LXMERT's class confidences and attributes, which records do not carry, are written as
    1.0 and 0.
    """
    if layout not in ("lxmert", "butd"):
        raise ValueError(f"unknown TSV layout {layout!r}; choices: lxmert, butd")
    n = 0
    with open(path, "w", encoding="utf-8", newline="") as f:
        for rec in records:
            w, h = (int(v) for v in rec["image_size"])
            boxes = np.asarray(rec["boxes"], dtype=np.float32) * np.float32([w, h, w, h])
            features = np.asarray(rec["features"], dtype=np.float32)
            r = len(features)
            if layout == "butd":
                row = [str(rec["image_id"]), str(w), str(h), str(r)]
            else:
                labels = rec.get("labels")
                labels = np.zeros(r, np.int64) if labels is None else np.asarray(labels)
                ones, zeros = np.ones(r, np.float32), np.zeros(r, np.int64)
                row = [str(rec["image_id"]), str(h), str(w), _b64(labels, np.int64)]
                row += [_b64(ones, np.float32), _b64(zeros, np.int64), _b64(ones, np.float32)]
                row += [str(r)]
            row += [_b64(boxes, np.float32), _b64(features, np.float32)]
            f.write("\t".join(row) + "\n")
            n += 1
    return n


class _RegionIndex:
    """Random access to a TSV's rows by image id: offsets only, rows are parsed on demand.

    A COCO-sized TSV holds tens of GB of features; keeping one offset per image is cheap.
    """

    def __init__(self, path: PathLike, stats: SkipStats) -> None:
        self.path = os.fspath(path)
        self.rows: dict[int | str, tuple[int, int]] = {}  # id -> (offset, line)
        with open(self.path, "rb") as f:
            offset = 0
            for n, line in enumerate(f, 1):
                ident = line.split(b"\t", 1)[0].decode("utf-8", "replace").strip()
                if ident:
                    key = _match_id(_image_id(ident))
                    if key in self.rows:
                        stats.skip("duplicate_regions", f"{self.path}:{n}")
                    else:
                        self.rows[key] = (offset, n)
                offset += len(line)
        self._file = open(self.path, "rb")  # noqa: SIM115 - closed by close()

    def get(self, image_id: Any) -> tuple[dict[str, Any] | None, str]:
        """(record or None, where): None with ``where`` = "" when the image has no row."""
        try:
            found = self.rows.get(_match_id(image_id))
        except (TypeError, ValueError):
            found = None
        if found is None:
            return None, ""
        offset, n = found
        self._file.seek(offset)
        line = self._file.readline().decode("utf-8", "replace").rstrip("\r\n")
        where = f"{self.path}:{n}"
        try:
            return _parse_butd_row(line.split("\t")), where
        except ValueError as exc:
            log.warning("%s: malformed region row (%s)", where, exc)
            return None, where

    def close(self) -> None:
        self._file.close()


# ---------------------------------------------------------------------------------------------
# Shared checks


def _load_json(path: PathLike, key: str) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        raise ValueError(f"{path}: expected a JSON object with a list under {key!r}")
    return data


def _check_common(split: str, shard_size: int, image_dir: PathLike | None, tsv: Any) -> None:
    if not isinstance(split, str) or not _CODE.fullmatch(split):
        raise ValueError(f"invalid split {split!r}: use letters, digits, '_' or '-'")
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    if image_dir is not None and not Path(image_dir).is_dir():
        raise FileNotFoundError(f"{image_dir}: image folder not found")
    if tsv is not None and not Path(tsv).is_file():
        raise FileNotFoundError(f"{tsv}: region feature TSV not found")


def _jpeg(path: Path) -> bytes:
    """The file's bytes if it is a JPEG, else the image re-encoded as one (OSError if neither)."""
    data = path.read_bytes()
    if data.startswith(_JPEG_MAGIC):
        return data
    try:
        with Image.open(io.BytesIO(data)) as img:
            buf = io.BytesIO()
            img.convert("RGB").save(buf, format="JPEG", quality=_JPEG_QUALITY)
    except (UnidentifiedImageError, ValueError) as exc:
        raise OSError(f"not an image ({exc})") from None
    return buf.getvalue()


class _Media:
    """The ``jpg`` and ``regions.npz`` members of one image, from whichever sources are given.

    Remembers the last image: consecutive samples (captions, questions) usually share it.
    """

    def __init__(self, image_dir: PathLike | None, regions: _RegionIndex | None) -> None:
        self.image_dir = None if image_dir is None else Path(image_dir)
        self.regions = regions
        self._last: tuple[Any, dict[str, bytes] | tuple[str, str]] | None = None

    def get(self, image_id: Any, file_name: str | None) -> dict[str, bytes] | tuple[str, str]:
        """The members, or (reason, what) to skip the sample with."""
        if self._last is not None and self._last[0] == (image_id, file_name):
            return self._last[1]
        got = self._load(image_id, file_name)
        self._last = ((image_id, file_name), got)
        return got

    def _load(self, image_id: Any, file_name: str | None) -> dict[str, bytes] | tuple[str, str]:
        members: dict[str, bytes] = {}
        if self.image_dir is not None:
            path = self.image_dir / str(file_name)
            if not path.is_file():
                return "missing_image", os.fspath(path)
            try:
                members["jpg"] = _jpeg(path)
            except OSError as exc:
                return "bad_image", f"{path} ({exc})"
        if self.regions is not None:
            record, where = self.regions.get(image_id)
            if record is None:
                if where:
                    return "bad_regions", where
                return "missing_regions", f"image {image_id} not in {self.regions.path}"
            members["regions.npz"] = regions_npz_bytes(record)
        return members


# ---------------------------------------------------------------------------------------------
# COCO captions


def convert_coco_captions(
    captions_json: PathLike,
    image_dir: PathLike,
    out_dir: PathLike,
    *,
    split: str,
    shard_size: int = 1000,
    regions_tsv: PathLike | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """COCO ``captions_*.json`` + its image folder to ``{split}-%06d.tar``, one sample a caption.

    Samples come image by image (in the file's ``images`` order), each image's captions in
    annotation order, so an image is read once; keys are the caption (annotation) ids.
    ``regions_tsv``: BUTD/LXMERT features joined by image id (LXMERT's ``COCO_val2014_...``
    names match COCO ids).
    """
    _check_common(split, shard_size, image_dir, regions_tsv)
    data = _load_json(captions_json, "images")
    if not isinstance(data.get("annotations"), list):
        raise ValueError(f"{captions_json}: expected a list under 'annotations'")
    stats = SkipStats(os.fspath(captions_json), "items")
    images: dict[Any, dict[str, Any]] = {}
    for i, img in enumerate(data["images"]):
        if not isinstance(img, dict) or "id" not in img or not img.get("file_name"):
            stats.skip("bad_image_entry", f"images[{i}]")
            continue
        images.setdefault(img["id"], img)
    by_image: dict[Any, list[dict[str, Any]]] = {}
    for i, ann in enumerate(data["annotations"]):
        ok = isinstance(ann, dict) and isinstance(ann.get("id"), int)
        if not ok or not isinstance(ann.get("caption"), str):
            stats.skip("malformed", f"annotations[{i}]")
        elif ann.get("image_id") not in images:
            stats.skip("unknown_image", f"caption {ann['id']} (image {ann.get('image_id')})")
        elif not ann["caption"].strip():
            stats.skip("empty", f"caption {ann['id']}")
        else:
            by_image.setdefault(ann["image_id"], []).append(ann)
    index = None if regions_tsv is None else _RegionIndex(regions_tsv, stats)
    media = _Media(image_dir, index)
    seen: set[int] = set()
    try:
        with ShardWriter(Path(out_dir) / f"{split}-%06d.tar", shard_size) as writer:
            bar = progress_bar(images.items(), desc=f"coco {split}", unit="image",
                               enabled=progress)  # fmt: skip
            for image_id, img in bar:
                anns = by_image.get(image_id, [])
                got = media.get(image_id, img["file_name"]) if anns else {}
                for ann in anns:
                    if isinstance(got, tuple):
                        stats.skip(got[0], f"caption {ann['id']}: {got[1]}")
                        continue
                    if ann["id"] in seen:
                        stats.skip("duplicate_id", f"caption {ann['id']}")
                        continue
                    seen.add(ann["id"])
                    caption = ann["caption"].strip()
                    record = {
                        "image_id": image_id,
                        "caption_id": ann["id"],
                        "file_name": img["file_name"],
                        "width": img.get("width"),
                        "height": img.get("height"),
                        "captions": {"en": caption},
                    }
                    writer.write({"__key__": str(ann["id"]), **got, "txt": caption, "json": record})
                    stats.written += 1
    finally:
        if index is not None:
            index.close()
    return stats.result(writer.shards)


# ---------------------------------------------------------------------------------------------
# VQA v2


def _answers(ann: dict[str, Any]) -> list[str] | None:
    answers = ann.get("answers")
    if not isinstance(answers, list) or not answers:
        return None
    out: list[str] = []
    for a in answers:
        if not isinstance(a, dict) or not isinstance(a.get("answer"), str):
            return None
        out.append(a["answer"])
    return out


def convert_vqa(
    questions_json: PathLike,
    annotations_json: PathLike | None,
    image_dir: PathLike | None,
    out_dir: PathLike,
    *,
    split: str,
    shard_size: int = 1000,
    regions_tsv: PathLike | None = None,
    image_name: str = VQA_IMAGE_NAME,
    progress: bool = False,
) -> dict[str, Any]:
    """VQA v2 questions (+ annotations) to ``{split}-%06d.tar``, one sample a question.

    Images (``image_dir``, files named by ``image_name`` with fields ``image_id``, ``split``
    and ``data_subtype``) or region features (``regions_tsv``) or both must be given.
    ``annotations_json`` None (the test split): no answers. Samples keep the questions file's
    order; keys are question ids; the ten answers are kept raw and in order.
    """
    if image_dir is None and regions_tsv is None:
        raise ValueError("convert_vqa needs image_dir or regions_tsv (or both)")
    _check_common(split, shard_size, image_dir, regions_tsv)
    questions = _load_json(questions_json, "questions")
    subtype = str(questions.get("data_subtype") or f"{split}2014")
    try:
        image_name.format(image_id=0, split=split, data_subtype=subtype)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"bad image_name {image_name!r} ({exc}); fields: image_id, split, data_subtype"
        ) from None
    stats = SkipStats(os.fspath(questions_json), "items")
    annotations = None if annotations_json is None else _vqa_annotations(annotations_json, stats)
    index = None if regions_tsv is None else _RegionIndex(regions_tsv, stats)
    media = _Media(image_dir, index)
    seen: set[int] = set()
    try:
        with ShardWriter(Path(out_dir) / f"{split}-%06d.tar", shard_size) as writer:
            bar = progress_bar(questions["questions"], desc=f"vqa {split}", unit="question",
                               enabled=progress)  # fmt: skip
            for i, q in enumerate(bar):
                record = _vqa_record(i, q, annotations, seen, stats)
                if record is None:
                    continue
                qid, image_id = record["question_id"], record["image_id"]
                name = None
                if image_dir is not None:
                    try:
                        name = image_name.format(
                            image_id=image_id, split=split, data_subtype=subtype
                        )
                    except (ValueError, TypeError):  # e.g. a str id under {image_id:012d}
                        stats.skip("bad_image_id", f"question {qid} (image {image_id!r})")
                        continue
                got = media.get(image_id, name)
                if isinstance(got, tuple):
                    stats.skip(got[0], f"question {qid}: {got[1]}")
                    continue
                seen.add(qid)
                writer.write({"__key__": str(qid), **got, "json": record})
                stats.written += 1
    finally:
        if index is not None:
            index.close()
    return stats.result(writer.shards, data_subtype=subtype)


def _vqa_annotations(path: PathLike, stats: SkipStats) -> dict[Any, dict[str, Any]]:
    """The annotations file's entries by question id; ones without an id are skipped."""
    annotations: dict[Any, dict[str, Any]] = {}
    for i, ann in enumerate(_load_json(path, "annotations")["annotations"]):
        if not isinstance(ann, dict) or "question_id" not in ann:
            stats.skip("bad_annotation", f"{path}: annotations[{i}]")
            continue
        annotations[ann["question_id"]] = ann
    return annotations


def _vqa_record(
    i: int,
    q: Any,
    annotations: dict[Any, dict[str, Any]] | None,
    seen: set[int],
    stats: SkipStats,
) -> dict[str, Any] | None:
    """The ``json`` of question ``q`` (entry ``i``) with its answers, or None, counted in
    ``stats``, for a malformed or repeated question or a missing or bad annotation."""
    ok = isinstance(q, dict) and isinstance(q.get("question_id"), int)
    if not ok or not isinstance(q.get("question"), str) or "image_id" not in q:
        stats.skip("malformed", f"questions[{i}]")
        return None
    qid, image_id = q["question_id"], q["image_id"]
    if qid in seen:
        stats.skip("duplicate_id", f"question {qid}")
        return None
    record: dict[str, Any] = {
        "question": q["question"],
        "question_id": qid,
        "image_id": image_id,
        "answers": [],
    }
    if annotations is None:  # the test split
        return record
    ann = annotations.get(qid)
    if ann is None:
        stats.skip("no_annotation", f"question {qid}")
        return None
    answers = _answers(ann)
    if answers is None or ann.get("image_id", image_id) != image_id:
        stats.skip("bad_annotation", f"question {qid}")
        return None
    record["answers"] = answers
    for field in ("answer_type", "question_type", "multiple_choice_answer"):
        if field in ann:
            record[field] = ann[field]
    return record


# ---------------------------------------------------------------------------------------------
# Karpathy splits (COCO, Flickr8k, Flickr30k)


def _karpathy_record(i: int, img: Any, stats: SkipStats) -> dict[str, Any] | None:
    """The ``json`` of ``images[i]`` with every usable caption, or None (counted in
    ``stats``) for a malformed entry, an unknown split or an image left without captions."""
    ok = isinstance(img, dict) and isinstance(img.get("filename"), str) and img["filename"]
    if not ok or not isinstance(img.get("sentences"), list):
        stats.skip("malformed", f"images[{i}]")
        return None
    if img.get("split") not in KARPATHY_SPLITS:
        stats.skip("unknown_split", f"images[{i}] (split {img.get('split')!r})")
        return None
    captions, sentids = [], []
    for j, s in enumerate(img["sentences"]):
        if not isinstance(s, dict) or not isinstance(s.get("raw"), str):
            stats.skip("bad_sentence", f"images[{i}].sentences[{j}]")
        elif not s["raw"].strip():
            stats.skip("empty_caption", f"images[{i}].sentences[{j}]", warn=False)
        else:
            captions.append(s["raw"].strip())
            sentids.append(s.get("sentid"))
    if not captions:
        stats.skip("no_captions", f"images[{i}] ({img['filename']})")
        return None
    stem = Path(img["filename"]).stem
    # COCO's entries carry the COCO id; Flickr's file stem is the Flickr id
    image_id = img.get("cocoid", int(stem) if stem.isdigit() else stem)
    return {
        "image_id": image_id,
        "imgid": img.get("imgid"),
        "file_name": img["filename"],
        "filepath": img.get("filepath"),
        "split": img["split"],
        "sentids": sentids,
        "captions": {"en": captions},
    }


def _karpathy_name(image_dir: PathLike | None, record: dict[str, Any]) -> str:
    """The image's path under ``image_dir``: ``filepath/filename`` (COCO's train2014/...),
    else ``filename`` alone (Flickr, or COCO's two folders merged into one)."""
    if record["filepath"] and image_dir is not None:
        nested = f"{record['filepath']}/{record['file_name']}"
        if (Path(image_dir) / nested).is_file():
            return nested
    return record["file_name"]


def convert_karpathy(
    dataset_json: PathLike,
    image_dir: PathLike | None,
    out_dir: PathLike,
    *,
    splits: Sequence[str] = ("train", "val", "test"),
    shard_size: int = 1000,
    regions_tsv: PathLike | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Karpathy's ``dataset_coco.json`` (or ``dataset_flickr8k.json`` / ``_flickr30k.json``,
    the same format) to ``{split}-%06d.tar`` per split, one sample an image.

    ``images[]`` entries have ``split`` (train, restval, val, test), ``filename`` (and COCO's
    ``filepath``, the folder: train2014 or val2014), ``sentences[].raw`` and COCO's
    ``cocoid``. train = train + restval (the 113k images of the captioning papers); val and
    test have 5000 images each (COCO; Flickr 1000). ``splits``: which of train, val, test
    to write. Images (``image_dir``: ``filepath/filename`` or ``filename`` under it) or
    region features (``regions_tsv``, joined by COCO id or Flickr file stem) or both.
    Samples: key = the COCO id (Flickr: the file stem), ``txt`` = the first caption,
    ``json`` = ``{"image_id", "imgid", "file_name", "filepath", "split", "sentids",
    "captions": {"en": [every caption]}}``. Malformed entries, missing images and images
    without captions are skipped and counted, naming the entry (``images[i]``).
    """
    if image_dir is None and regions_tsv is None:
        raise ValueError("convert_karpathy needs image_dir or regions_tsv (or both)")
    wanted = sorted(set(splits), key=list(splits).index)
    for split in wanted:
        if split not in KARPATHY_SPLITS.values():
            raise ValueError(f"unknown split {split!r}; choices: train, val, test")
    _check_common("train", shard_size, image_dir, regions_tsv)
    data = _load_json(dataset_json, "images")
    stats = SkipStats(os.fspath(dataset_json), "items")
    index = None if regions_tsv is None else _RegionIndex(regions_tsv, stats)
    media = _Media(image_dir, index)
    written = dict.fromkeys(wanted, 0)
    seen: set[str] = set()
    try:
        with ExitStack() as stack:
            writers = {
                s: stack.enter_context(ShardWriter(Path(out_dir) / f"{s}-%06d.tar", shard_size))
                for s in wanted
            }
            bar = progress_bar(data["images"], desc="karpathy", unit="image", enabled=progress)
            for i, img in enumerate(bar):
                record = _karpathy_record(i, img, stats)
                split = None if record is None else KARPATHY_SPLITS[record["split"]]
                if record is None or split not in writers:
                    continue  # skipped (and counted), or another split's image: not a skip
                key = _KEY_UNSAFE.sub("_", str(record["image_id"]))
                if key in seen:
                    stats.skip("duplicate_id", f"images[{i}] (image {record['image_id']})")
                    continue
                got = media.get(record["image_id"], _karpathy_name(image_dir, record))
                if isinstance(got, tuple):
                    stats.skip(got[0], f"images[{i}]: {got[1]}")
                    continue
                seen.add(key)
                caption = record["captions"]["en"][0]
                writers[split].write({"__key__": key, **got, "txt": caption, "json": record})
                written[split] += 1
                stats.written += 1
    finally:
        if index is not None:
            index.close()
    shards = [p for w in writers.values() for p in w.shards]
    return stats.result(shards, splits=written)


# --------------------------------------------------------------------------------------------
# mmptm data coco | vqa | karpathy


def _vl_arguments(p: argparse.ArgumentParser) -> None:
    # the command's 10000 samples a shard are not the functions' default (1000)
    shard_arguments(p, convert_coco_captions, split="train", shard_size=10000)
    p.add_argument("--images", default=None, help="COCO image folder")
    p.add_argument("--regions", default=None, help="bottom-up-attention TSV features")
    p.add_argument("--no-progress", action="store_true")


@CONVERTERS.register(
    "coco", "COCO captions JSON (--input) + image folder (--images)", _vl_arguments
)
def _coco_command(args: argparse.Namespace) -> int:
    stats = convert_coco_captions(
        args.input[0], args.images, args.out, split=args.split, shard_size=args.shard_size,
        regions_tsv=args.regions, progress=not args.no_progress,
    )  # fmt: skip
    print_stats(stats)
    return 0


@CONVERTERS.register(
    "vqa", "VQA v2 questions JSON [+ annotations JSON] (--input) + --images/--regions",
    _vl_arguments,
)  # fmt: skip
def _vqa_command(args: argparse.Namespace) -> int:
    questions, annotations = [*args.input, None][:2]
    stats = convert_vqa(
        questions, annotations, args.images, args.out, split=args.split,
        shard_size=args.shard_size, regions_tsv=args.regions, progress=not args.no_progress,
    )  # fmt: skip
    print_stats(stats)
    return 0


def _karpathy_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="dataset_coco.json / dataset_flickr30k.json")
    p.add_argument("--out", required=True)
    p.add_argument("--images", default=None, help="image folder (COCO: holding train2014/...)")
    p.add_argument("--regions", default=None, help="bottom-up-attention TSV features")
    p.add_argument("--splits", default="train,val,test", help="which splits to write")
    # the command's 10000 samples a shard are not the function's default (1000)
    p.add_argument("--shard-size", type=int, default=10000)
    p.add_argument("--no-progress", action="store_true")


@CONVERTERS.register(
    "karpathy", "Karpathy split JSON (COCO / Flickr8k / Flickr30k) + --images/--regions",
    _karpathy_arguments,
)  # fmt: skip
def _karpathy_command(args: argparse.Namespace) -> int:
    stats = convert_karpathy(
        args.input, args.images, args.out, splits=[s.strip() for s in args.splits.split(",")],
        shard_size=args.shard_size, regions_tsv=args.regions, progress=not args.no_progress,
    )  # fmt: skip
    print_stats(stats)
    return 0
