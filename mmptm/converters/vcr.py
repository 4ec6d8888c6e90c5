"""VCR's annotation json lines (Zellers et al. 2019) + its detections + region features →
webdataset shards of multiple-choice samples, Q→A and QA→R.

Each line of ``train.jsonl`` / ``val.jsonl`` holds ``question`` (a token list), four
``answer_choices`` and four ``rationale_choices`` (token lists), ``answer_label``,
``rationale_label``, ``objects`` (the class name of each detection of the image), ``img_fn``,
``metadata_fn`` (a json beside the image, under ``--images``: ``boxes`` [[x1, y1, x2, y2,
score], ...] in pixels, ``width``, ``height``), ``annot_id`` and ``img_id``. A token is a word
or a list of detection indices, VCR's object references; this converter writes each
reference as the detections' class names ("person", or "person and car" for ``[0, 2]``, "a,
b and c" for three): the words a text encoder pre-trained on captions knows (R2C's and
UNITER's person names are not used). Words are joined by spaces, punctuation and clitics
("?", "'s", "n't") to the word before.

Region features come from a bottom-up-attention TSV (:mod:`mmptm.converters.vl`'s layouts)
extracted at the detections' own boxes, one row per image, found by the line's ``img_id``
or else the image file's stem; a sample's ``regions.npz`` holds those features with the
detections' boxes normalised by the image's size, so region i is detection i, the one
``[i]`` refers to. A row whose region count differs from the detections' is not at their
boxes and the line is skipped.

Two samples per line (:func:`vcr_samples`), keyed ``<annot_id>-qa`` and ``<annot_id>-qar``
(:mod:`mmptm.modalities.choices`): ``regions.npz`` and ``json`` = ``{"question_id", "task",
"question", "choices", "label", "image_id", "img_fn", "objects"}``; QA→R's question is the
question followed by its right answer. Lines that are not JSON, lack a field, have a token
that is neither a word nor a list of valid detection indices, labels outside 0..3 (VCR's
test set has none: it is scored by its leaderboard), or whose detections or features are
missing or do not match are skipped and counted, named by file and line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from mmptm.converters import print_stats
from mmptm.converters.text import SkipStats
from mmptm.converters.vl import _KEY_UNSAFE, _check_common, _RegionIndex
from mmptm.data.shards import ShardWriter
from mmptm.modalities.choices import task_key
from mmptm.modalities.regions import regions_npz_bytes
from mmptm.registry import CONVERTERS

PathLike = str | os.PathLike[str]
_CHOICES = 4
_FIELDS = ("question", "answer_choices", "rationale_choices", "answer_label",
           "rationale_label", "objects", "img_fn", "metadata_fn")  # fmt: skip
_ATTACHED = re.compile(r"[.,?!;:)\]]+|'[a-z]*|n't", re.IGNORECASE)  # joined to the word before


class BadLine(ValueError):
    """A line to skip: ``reason`` is its count's name."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _names(indices: list[Any], objects: list[str]) -> str:
    """An object reference's words: the detections' class names, "a, b and c"."""
    ok = indices and all(isinstance(i, int) and not isinstance(i, bool) for i in indices)
    if not ok or not all(0 <= i < len(objects) for i in indices):
        raise BadLine("bad_reference")
    names = [str(objects[i]) for i in indices]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def render_tokens(tokens: Any, objects: list[str]) -> str:
    """VCR's tokens (words and lists of detection indices) as a sentence (module docstring)."""
    if not isinstance(tokens, list) or not tokens:
        raise BadLine("bad_tokens")
    words: list[str] = []
    for token in tokens:
        if isinstance(token, list):
            words.append(_names(token, objects))
        elif isinstance(token, str) and token.strip():
            token = token.strip()
            if words and _ATTACHED.fullmatch(token):
                words[-1] += token
            else:
                words.append(token)
        else:
            raise BadLine("bad_tokens")
    return " ".join(words)


def vcr_samples(
    question_id: str, question: dict[str, Any], members: dict[str, bytes]
) -> list[dict[str, Any]]:
    """The Q→A and QA→R samples of one question: ``question`` holds ``question`` (text),
    ``answers``, ``answer_label``, ``rationales``, ``rationale_label`` and any other fields,
    which go into both samples' ``json``; ``members`` are the image's (``regions.npz``)."""
    q = question
    extra = {k: v for k, v in q.items() if k not in _QUESTION_FIELDS}
    right = q["answers"][q["answer_label"]]
    out = []
    for task, text, choices, label in (
        ("qa", q["question"], q["answers"], q["answer_label"]),
        ("qar", f"{q['question']} {right}", q["rationales"], q["rationale_label"]),
    ):
        meta = {"question_id": question_id, "task": task, "question": text,
                "choices": choices, "label": label, **extra}  # fmt: skip
        out.append({"__key__": task_key(question_id, task), **members, "json": meta})
    return out


_QUESTION_FIELDS = ("question", "answers", "answer_label", "rationales", "rationale_label")


def _question(entry: Any) -> dict[str, Any]:
    """A parsed line's question, choices and labels as text (raises :class:`BadLine`)."""
    if not isinstance(entry, dict) or any(k not in entry for k in _FIELDS):
        raise BadLine("bad_entry")
    objects = entry["objects"]
    if not isinstance(objects, list) or not all(isinstance(o, str) for o in objects):
        raise BadLine("bad_entry")
    q: dict[str, Any] = {"question": render_tokens(entry["question"], objects)}
    for kind, field in (("answer", "answer_choices"), ("rationale", "rationale_choices")):
        choices, label = entry[field], entry[f"{kind}_label"]
        if not isinstance(choices, list) or len(choices) != _CHOICES:
            raise BadLine("bad_choices")
        if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < _CHOICES:
            raise BadLine("bad_label")
        q[f"{kind}s"] = [render_tokens(c, objects) for c in choices]
        q[f"{kind}_label"] = label
    q.update(image_id=str(entry.get("img_id", "")), img_fn=str(entry["img_fn"]), objects=objects)
    return q


def _detections(images: Path, metadata_fn: Any) -> tuple[np.ndarray, list[int]]:
    """(boxes [R,4] normalised, [w, h]) of an image's metadata json (raises :class:`BadLine`)."""
    path = images / str(metadata_fn)
    if not path.is_file():
        raise BadLine("missing_metadata")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        w, h = int(meta["width"]), int(meta["height"])
        boxes = np.asarray([b[:4] for b in meta["boxes"]], dtype=np.float32).reshape(-1, 4)
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError):
        raise BadLine("bad_metadata") from None
    if w <= 0 or h <= 0 or not len(boxes) or not np.isfinite(boxes).all():
        raise BadLine("bad_metadata")
    return np.clip(boxes / np.float32([w, h, w, h]), 0.0, 1.0), [w, h]


def _regions(entry: dict[str, Any], q: dict[str, Any], images: Path, index: _RegionIndex) -> bytes:
    """The line's ``regions.npz``: its TSV features at its detections' boxes."""
    boxes, size = _detections(images, entry["metadata_fn"])
    if len(boxes) != len(q["objects"]):
        raise BadLine("bad_metadata")  # the references index both
    record, where = None, ""
    for ident in (q["image_id"], Path(q["img_fn"]).stem):
        if ident:
            record, where = index.get(ident)
            if record is not None or where:
                break
    if record is None:
        raise BadLine("bad_regions" if where else "missing_regions")
    if len(record["features"]) != len(boxes):
        raise BadLine("regions_mismatch")
    return regions_npz_bytes({"features": record["features"], "boxes": boxes,
                              "image_size": size})  # fmt: skip


def convert_vcr(
    input_jsonl: PathLike,
    images: PathLike,
    regions_tsv: PathLike,
    out_dir: PathLike,
    *,
    split: str,
    shard_size: int = 1000,
) -> dict[str, Any]:
    """VCR json lines + metadata + a region TSV → ``{split}-%06d.tar`` (module docstring)."""
    _check_common(split, shard_size, images, regions_tsv)
    path = Path(input_jsonl)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (VCR json lines)")
    stats = SkipStats(os.fspath(input_jsonl))
    index = _RegionIndex(regions_tsv, stats)
    try:
        with (
            ShardWriter(Path(out_dir) / f"{split}-%06d.tar", shard_size) as writer,
            open(path, encoding="utf-8") as f,
        ):
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                    q = _question(entry)
                    npz = _regions(entry, q, Path(images), index)
                except json.JSONDecodeError:
                    stats.skip("bad_json", n)
                    continue
                except BadLine as bad:
                    stats.skip(bad.reason, n)
                    continue
                ident = _KEY_UNSAFE.sub("_", str(entry.get("annot_id", f"{split}-{n}")))
                for sample in vcr_samples(ident, q, {"regions.npz": npz}):
                    writer.write(sample)
                stats.written += 2
    finally:
        index.close()
    return stats.result(writer.shards)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="VCR train.jsonl / val.jsonl")
    p.add_argument("--images", required=True, help="vcr1images/ (each line's metadata_fn)")
    p.add_argument("--regions", required=True, help="region TSV at the detections' boxes")
    p.add_argument("--out", required=True)
    p.add_argument("--split", required=True, help="train, val ...")
    p.add_argument("--shard-size", type=int, default=1000)


@CONVERTERS.register(
    "vcr", "VCR json lines (--input) + detections (--images) + region TSV (--regions)", _arguments
)
def _command(args: argparse.Namespace) -> int:
    stats = convert_vcr(args.input, args.images, args.regions, args.out, split=args.split,
                        shard_size=args.shard_size)  # fmt: skip
    print_stats(stats)
    return 0


__all__ = ["convert_vcr", "render_tokens", "vcr_samples"]
