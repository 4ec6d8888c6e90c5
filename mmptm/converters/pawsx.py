"""Converter for PAWS-X (paraphrase adversaries, Yang et al. 2019) TSVs to sentence-pair shards.

Input: PAWS-X's ``train.tsv`` / ``translated_train.tsv`` / ``dev_2k.tsv`` / ``test_2k.tsv``:
a header line, then ``id<TAB>sentence1<TAB>sentence2<TAB>label`` with label 1 = paraphrase,
0 = not. A sample is a pair as XNLI's (``mmptm data xnli``), so the same ``classification``
head and evaluation read it: ``json`` = ``{"premise": sentence1, "hypothesis": sentence2,
"label": "paraphrase" | "not_paraphrase", "language", "pair_id"}`` (the label plug-in's
``names`` in :data:`PAWSX_LABELS` order, as the ``pawsx`` recipe sets them). Shards are
``{split}-{lang}-%06d.tar`` (split: default from the file name: ``test_2k.tsv`` → test).

As the XNLI converter, rows that cannot be used are skipped, counted per reason and named by
``file:line`` in the log and the summary (``skipped_lines``): a row without four columns, a
label other than 0 / 1, an empty sentence (PAWS-X's machine-translated sets have a few). A
file whose header lacks the columns is one error before anything is written.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mmptm.converters import print_stats
from mmptm.converters.tagging import split_of
from mmptm.converters.text import SkipStats
from mmptm.data.shards import ShardWriter
from mmptm.registry import CONVERTERS, default_of

PathLike = str | os.PathLike[str]
#: class names in index order: PAWS-X's label 0 and 1
PAWSX_LABELS = ("not_paraphrase", "paraphrase")
COLUMNS = ("id", "sentence1", "sentence2", "label")
_CODE = re.compile(r"[A-Za-z0-9_-]+")


def _rows(path: PathLike) -> Iterator[tuple[int, list[str]]]:
    # QUOTE_NONE: sentences hold unbalanced '"', which would swallow the lines after them
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        for row in reader:
            yield reader.line_num, row


def convert_pawsx(
    tsv: PathLike, out: PathLike, *, language: str, split: str = "", shard_size: int = 10000
) -> dict[str, Any]:
    """A PAWS-X TSV to ``out/{split}-{language}-%06d.tar`` (module docstring)."""
    if not isinstance(language, str) or not _CODE.fullmatch(language):
        raise ValueError(f"invalid language code {language!r}: use letters, digits, '_' or '-'")
    split = split or split_of(tsv)
    rows = _rows(tsv)
    header = next(rows, (0, []))[1]
    cols = {name.strip(): i for i, name in enumerate(header)}
    if not set(COLUMNS) <= cols.keys():
        raise ValueError(f"{tsv}: expected a PAWS-X header {'/'.join(COLUMNS)}, got {header}")
    at = [cols[c] for c in COLUMNS]
    stats = SkipStats(os.fspath(tsv))
    seen: set[str] = set()
    with ShardWriter(Path(out) / f"{split}-{language}-%06d.tar", shard_size) as writer:
        for n, row in rows:
            if len(row) <= max(at):
                stats.skip("malformed", n)
                continue
            pair_id, s1, s2, label = (row[i].strip() for i in at)
            if label not in ("0", "1"):
                stats.skip("unknown_label", n)
                continue
            if not s1 or not s2:
                stats.skip("empty", n)
                continue
            key = re.sub(r"[^\w-]", "_", pair_id) or "pair"
            if key in seen:  # ids need not be unique; keys must be
                key = f"{key}_line{n}"
            seen.add(key)
            record = {"premise": s1, "hypothesis": s2, "label": PAWSX_LABELS[int(label)],
                      "language": language, "pair_id": pair_id}  # fmt: skip
            writer.write({"__key__": key, "json": record})
            stats.written += 1
    return stats.result(writer.shards, split=split, language=language)


# --------------------------------------------------------------------------------------------
# mmptm data pawsx


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="a PAWS-X TSV (with its header line)")
    p.add_argument("--out", required=True)
    p.add_argument("--lang", required=True, help="the file's language code")
    p.add_argument("--split", default=default_of(convert_pawsx, "split"),
                   help="default: from the file name (train, dev, test)")  # fmt: skip
    p.add_argument("--shard-size", type=int, default=default_of(convert_pawsx, "shard_size"))


@CONVERTERS.register(
    "pawsx", "paraphrase pairs: PAWS-X TSV (id, sentence1, sentence2, label)", _arguments
)
def _pawsx_command(args: argparse.Namespace) -> int:
    stats = convert_pawsx(args.input, args.out, language=args.lang, split=args.split,
                          shard_size=args.shard_size)  # fmt: skip
    print_stats(stats)
    return 0


__all__ = ["COLUMNS", "PAWSX_LABELS", "convert_pawsx"]
