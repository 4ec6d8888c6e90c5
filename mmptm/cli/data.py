"""``mmptm data NAME``: write a data set as webdataset shards, one command per registered
converter (:data:`mmptm.registry.CONVERTERS`; toyworld's generator is one of them)."""

from __future__ import annotations

import argparse

from mmptm.registry import CONVERTERS


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm data ...``; the converters are imported when the group is used."""
    sub.add_parser("data", help="write data sets as webdataset shards", fill=_fill)


def _fill(data: argparse.ArgumentParser) -> None:
    data_sub = data.add_subparsers(dest="dataset", required=True)
    for command in CONVERTERS:
        p = data_sub.add_parser(command.name, help=command.summary)
        command.add_arguments(p)
        p.set_defaults(fn=command.run)
