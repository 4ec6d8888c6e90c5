"""NLVR2's json lines (Suhr et al. 2019) + region features → webdataset shards of image pairs.

Each line of ``train.json`` / ``dev.json`` / ``test1.json`` is an object with ``identifier``
(``<split>-<set>-<pair>-<sentence>``), ``sentence`` and ``label`` ("True" / "False"); its
two images are ``<split>-<set>-<pair>-img0`` (left) and ``-img1`` (right), the ids LXMERT's
NLVR2 feature TSVs (``train_obj36.tsv``, ``valid_obj36.tsv``) carry; ``left_image`` /
``right_image`` fields, where a line has them, name the images instead.

One sample per line in ``{split}-%06d.tar``: key = the identifier, ``txt`` = the sentence,
``regions.npz`` (left), ``right.regions.npz`` (right) and ``json`` = ``{"identifier",
"sentence", "label", "left", "right"}`` (what the ``image_pair`` plug-in reads). A line that
is not JSON, lacks a field, has a label other than True/False, or whose images have no
region features is skipped and counted, named by file and line.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from mmptm.converters import print_stats
from mmptm.converters.text import SkipStats
from mmptm.converters.vl import _check_common, _RegionIndex
from mmptm.data.shards import ShardWriter
from mmptm.modalities.pair import RIGHT_MEMBER, read_truth
from mmptm.modalities.regions import regions_npz_bytes
from mmptm.registry import CONVERTERS

PathLike = str | os.PathLike[str]


def pair_images(entry: dict[str, Any]) -> tuple[str, str]:
    """(left, right) image ids of an NLVR2 line."""
    if "left_image" in entry and "right_image" in entry:
        return str(entry["left_image"]), str(entry["right_image"])
    base = str(entry["identifier"]).rsplit("-", 1)[0]
    return f"{base}-img0", f"{base}-img1"


def _record(line: str, n: int, stats: SkipStats) -> dict[str, Any] | None:
    """The json member of line ``n``, or None (skipped and counted)."""
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        stats.skip("bad_json", n)
        return None
    fields = ("identifier", "sentence", "label")
    if not isinstance(entry, dict) or any(k not in entry for k in fields):
        stats.skip("bad_entry", n)
        return None
    if not isinstance(entry["sentence"], str) or not entry["sentence"].strip():
        stats.skip("bad_sentence", n)
        return None
    try:
        truth = read_truth(entry["label"])
    except ValueError:
        stats.skip("bad_label", n)
        return None
    left, right = pair_images(entry)
    return {"identifier": str(entry["identifier"]), "sentence": entry["sentence"].strip(),
            "label": str(bool(truth)), "left": left, "right": right}  # fmt: skip


def convert_nlvr2(
    input_json: PathLike,
    regions_tsv: PathLike,
    out_dir: PathLike,
    *,
    split: str,
    shard_size: int = 1000,
) -> dict[str, Any]:
    """NLVR2 json lines + a region TSV → ``{split}-%06d.tar`` (module docstring)."""
    _check_common(split, shard_size, None, regions_tsv)
    path = Path(input_json)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (NLVR2 json lines)")
    stats = SkipStats(os.fspath(input_json))
    index = _RegionIndex(regions_tsv, stats)
    try:
        with (
            ShardWriter(Path(out_dir) / f"{split}-%06d.tar", shard_size) as writer,
            open(path, encoding="utf-8") as f,
        ):
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                record = _record(line, n, stats)
                if record is None:
                    continue
                members = {}
                for side, member in (("left", "regions.npz"), ("right", RIGHT_MEMBER)):
                    regions, where = index.get(record[side])
                    if regions is None:
                        why = "bad_regions" if where else "missing_regions"
                        stats.skip(why, n)
                        break
                    members[member] = regions_npz_bytes(regions)
                else:
                    key = record["identifier"].replace(".", "_")
                    writer.write({"__key__": key, **members, "txt": record["sentence"],
                                  "json": record})  # fmt: skip
                    stats.written += 1
    finally:
        index.close()
    return stats.result(writer.shards)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="NLVR2 train.json / dev.json / test1.json")
    p.add_argument("--regions", required=True, help="region TSV of the split's images")
    p.add_argument("--out", required=True)
    p.add_argument("--split", required=True, help="train, val, test ...")
    p.add_argument("--shard-size", type=int, default=1000)


@CONVERTERS.register("nlvr2", "NLVR2 json lines (--input) + region TSV (--regions)", _arguments)
def _command(args: argparse.Namespace) -> int:
    stats = convert_nlvr2(args.input, args.regions, args.out, split=args.split,
                          shard_size=args.shard_size)  # fmt: skip
    print_stats(stats)
    return 0


__all__ = ["convert_nlvr2", "pair_images"]
