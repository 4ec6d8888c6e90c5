"""Converters: the data sets people have (COCO, VQA, XNLI, parallel text, MSR-VTT, audio
corpora, knowledge graphs, span annotations) written as webdataset shards; one module per family.

Each module registers its commands in :data:`mmptm.registry.CONVERTERS` (a name, a one-line
summary, its flags and the function to run), which ``mmptm data NAME`` and its help list.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import Any

from mmptm.registry import default_of


def shard_arguments(
    p: argparse.ArgumentParser,
    fn: Callable[..., Any],
    *,
    split: str | None = None,
    shard_size: int | None = None,
) -> None:
    """Add --input, --out, --split and --shard-size, the flags the text and VL commands share.

    Their defaults are those of ``fn``, the converter the command calls, unless given.
    """
    split = default_of(fn, "split") if split is None else split
    shard_size = default_of(fn, "shard_size") if shard_size is None else shard_size
    p.add_argument("--input", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--split", default=split)
    p.add_argument("--shard-size", type=int, default=shard_size)


def print_stats(stats: Mapping[str, Any]) -> None:
    """Print a converter's counts as JSON (without the lists of what it skipped)."""
    print(json.dumps({k: v for k, v in stats.items() if not k.startswith("skipped_")}, indent=1))
