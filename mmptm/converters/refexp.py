"""RefCOCO, RefCOCO+ and RefCOCOg (Yu et al. 2016; Mao et al. 2016) to webdataset shards.

Inputs, as the ``refer`` toolkit ships them: ``refs(unc).p`` (``refs(umd).p``,
``refs(google).p``), a pickled list of refs ``{"ref_id", "ann_id", "image_id", "split",
"category_id", "sentences": [{"sent_id", "sent", "raw", "tokens"}, ...]}``, and
``instances.json``, COCO-style ``images`` (``id``, ``width``, ``height``) and ``annotations``
(``id``, ``bbox`` = [x, y, w, h] in pixels). Region features come from a bottom-up-attention
TSV (the BUTD / LXMERT layout :mod:`mmptm.converters.vl` reads), joined by COCO image id.

One sample per sentence, in ``{split}-%06d.tar`` of its ref's split (train, val, testA, testB
for RefCOCO and RefCOCO+; train, val, test for RefCOCOg's umd split): key
``<ref_id>_<sent_id>``, ``txt`` = the sentence (``sent``), ``regions.npz``, and ``json`` =
``{"ref_id", "sent_id", "ann_id", "image_id", "category_id", "split", "ref_box"}``, the gold
box normalised to [0, 1] by the image's size, the frame of the region boxes (the
``ref_box`` plug-in reads it). Malformed refs and sentences, annotations or images the
instances file lacks, and images without region features are skipped and counted, each named
(``refs[i]``, ``ref <id> sentence <id>``, the TSV line).

The pickle is read with an unpickler that builds only plain containers, strings and numbers
(a pickle can run code otherwise); the refer toolkit's Python 2 pickles decode as latin-1.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import pickle
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from mmptm.converters import print_stats
from mmptm.converters.text import SkipStats
from mmptm.converters.vl import _check_common, _load_json, _Media, _RegionIndex
from mmptm.data.shards import ShardWriter
from mmptm.progress import progress_bar
from mmptm.registry import CONVERTERS

PathLike = str | os.PathLike[str]
#: the splits of the refer toolkit's files (RefCOCO/+: testA people, testB other objects)
REF_SPLITS = ("train", "val", "test", "testA", "testB", "testC")


class _PlainUnpickler(pickle.Unpickler):
    """Builds lists, dicts, strings and numbers; refuses any class or function."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses to build {module}.{name}")


def read_refs(path: PathLike) -> list[Any]:
    """The list of refs of a ``refs(*).p`` file (one-line errors for an unreadable file)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (RefCOCO's refs(unc).p)")
    try:
        refs = _PlainUnpickler(io.BytesIO(path.read_bytes()), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"{path}: not a refs pickle of plain data ({exc})") from None
    if not isinstance(refs, list):
        raise ValueError(f"{path}: expected a pickled list of refs, got {type(refs).__name__}")
    return refs


def _instances(path: PathLike, stats: SkipStats) -> tuple[dict[Any, dict], dict[Any, list]]:
    """(image id → image entry, annotation id → bbox) of ``instances.json``."""
    data = _load_json(path, "annotations")
    images = {
        im["id"]: im for im in data.get("images") or [] if isinstance(im, dict) and "id" in im
    }
    boxes: dict[Any, list] = {}
    for i, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or "id" not in ann or "bbox" not in ann:
            stats.skip("bad_annotation", f"{path}: annotations[{i}]")
            continue
        boxes[ann["id"]] = ann["bbox"]
    return images, boxes


def normalised_box(bbox: Any, width: Any, height: Any) -> list[float] | None:
    """COCO [x, y, w, h] pixels → [x1, y1, x2, y2] in [0, 1] of the image; None if malformed."""
    nums = (int, float)
    if not (isinstance(bbox, (list, tuple)) and len(bbox) == 4):
        return None
    if not all(isinstance(v, nums) and not isinstance(v, bool) for v in (*bbox, width, height)):
        return None
    x, y, w, h = (float(v) for v in bbox)
    if not all(math.isfinite(v) for v in (x, y, w, h)) or w < 0 or h < 0:
        return None
    if width <= 0 or height <= 0:
        return None
    box = (x / width, y / height, (x + w) / width, (y + h) / height)
    return [min(max(v, 0.0), 1.0) for v in box]


def _ref_samples(i: int, ref: Any, images: dict, boxes: dict, stats: SkipStats) -> list[tuple]:
    """(key, sentence, json) of each good sentence of ``refs[i]``; the bad ones counted."""
    keys = ("ref_id", "ann_id", "image_id", "split", "sentences")
    if not isinstance(ref, dict) or any(k not in ref for k in keys):
        stats.skip("bad_ref", f"refs[{i}] (needs {', '.join(keys)})")
        return []
    if ref["ann_id"] not in boxes:
        stats.skip("missing_annotation", f"refs[{i}]: ann_id {ref['ann_id']}")
        return []
    image = images.get(ref["image_id"])
    if image is None:
        stats.skip("missing_image", f"refs[{i}]: image_id {ref['image_id']}")
        return []
    box = normalised_box(boxes[ref["ann_id"]], image.get("width"), image.get("height"))
    if box is None:
        stats.skip("bad_box", f"refs[{i}]: ann_id {ref['ann_id']}")
        return []
    meta = {k: ref[k] for k in ("ref_id", "ann_id", "image_id", "split")}
    meta.update(category_id=ref.get("category_id"), ref_box=box)
    out = []
    for j, sent in enumerate(ref["sentences"] if isinstance(ref["sentences"], list) else []):
        text = sent.get("sent") if isinstance(sent, dict) else None
        if not isinstance(text, str) or not text.strip():
            stats.skip("bad_sentence", f"refs[{i}] (ref {ref['ref_id']}) sentences[{j}]")
            continue
        sent_id = sent.get("sent_id", j)
        out.append((f"{ref['ref_id']}_{sent_id}", text.strip(), {**meta, "sent_id": sent_id}))
    return out


def convert_refcoco(
    refs_pickle: PathLike,
    instances_json: PathLike,
    regions_tsv: PathLike,
    out_dir: PathLike,
    *,
    splits: Sequence[str] = REF_SPLITS,
    shard_size: int = 1000,
    progress: bool = False,
) -> dict[str, Any]:
    """RefCOCO-style refs + instances + region features → shards per split (module docstring).

    ``splits``: which of the refs' splits to write (those absent from the file write nothing).
    """
    for split in splits:
        if split not in REF_SPLITS:
            raise ValueError(f"unknown split {split!r}; choices: {', '.join(REF_SPLITS)}")
    _check_common("train", shard_size, None, regions_tsv)
    refs = read_refs(refs_pickle)
    stats = SkipStats(os.fspath(refs_pickle), "items")
    images, boxes = _instances(instances_json, stats)
    index = _RegionIndex(regions_tsv, stats)
    media = _Media(None, index)
    written = dict.fromkeys(splits, 0)
    try:
        with ExitStack() as stack:
            writers: dict[str, ShardWriter] = {}
            for i, ref in enumerate(progress_bar(refs, desc="refs", enabled=progress)):
                samples = _ref_samples(i, ref, images, boxes, stats)
                if not samples or samples[0][2]["split"] not in written:
                    continue
                split = samples[0][2]["split"]
                got = media.get(samples[0][2]["image_id"], None)
                if isinstance(got, tuple):
                    stats.skip(got[0], f"refs[{i}]: {got[1]}")
                    continue
                if split not in writers:
                    pattern = Path(out_dir) / f"{split}-%06d.tar"
                    writers[split] = stack.enter_context(ShardWriter(pattern, shard_size))
                for key, text, meta in samples:
                    writers[split].write({"__key__": key, **got, "txt": text, "json": meta})
                    written[split] += 1
                    stats.written += 1
    finally:
        index.close()
    shards = [p for w in writers.values() for p in w.shards]
    return stats.result(shards, splits=written)


# --------------------------------------------------------------------------------------------
# mmptm data refcoco


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--refs", required=True, help="refs(unc).p / refs(umd).p / refs(google).p")
    p.add_argument("--instances", required=True, help="instances.json of the same data set")
    p.add_argument("--regions", required=True, help="bottom-up-attention TSV features")
    p.add_argument("--out", required=True)
    p.add_argument("--splits", default=",".join(REF_SPLITS), help="comma list")
    p.add_argument("--shard-size", type=int, default=1000)
    p.add_argument("--no-progress", action="store_true")


@CONVERTERS.register(
    "refcoco", "RefCOCO/+/g refs pickle + instances.json + region TSV (--regions)", _arguments
)
def _command(args: argparse.Namespace) -> int:
    stats = convert_refcoco(
        args.refs, args.instances, args.regions, args.out,
        splits=[s.strip() for s in args.splits.split(",") if s.strip()],
        shard_size=args.shard_size, progress=not args.no_progress,
    )  # fmt: skip
    print_stats(stats)
    return 0


__all__ = ["REF_SPLITS", "convert_refcoco", "normalised_box", "read_refs"]
