"""Flag types shared by the command groups."""

from __future__ import annotations

import argparse


def device(value: str) -> str:
    """A ``--device`` value this machine has (``cpu``, ``cuda``, ``cuda:N``, ``auto``), checked
    when the command line is parsed, so a missing GPU is one line before anything loads; the
    value is passed on as given."""
    from mmptm.batch import pick_device

    try:
        pick_device(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--device ")) from None
    return value
