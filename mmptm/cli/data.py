"""``mmptm data NAME``: write a data set as webdataset shards, one command per registered
converter (:data:`mmptm.registry.CONVERTERS`; toyworld's generator is one of them)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from mmptm.registry import CONVERTERS


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm data ...``; the converters are imported when the group is used."""
    sub.add_parser("data", help="write data sets as webdataset shards", fill=_fill)


def _fill(data: argparse.ArgumentParser) -> None:
    data_sub = data.add_subparsers(dest="dataset", required=True)
    for command in CONVERTERS:
        p = data_sub.add_parser(command.name, help=command.summary)
        command.add_arguments(p)
        if command.name != "manifest":
            p.add_argument(
                "--manifest", action="store_true",
                help="also write the shards' manifest (shardindex.json: samples and languages "
                "per shard) beside them; see docs/data/at-scale.md",
            )  # fmt: skip
        p.set_defaults(fn=_writing_manifests(command.run))


def _writing_manifests(run: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """``run``, its shard writers adding their shards to their folder's manifest if asked."""

    def wrapped(args: argparse.Namespace) -> int:
        from mmptm.data.shards import manifests

        with manifests(getattr(args, "manifest", False)):
            return run(args)

    return wrapped
