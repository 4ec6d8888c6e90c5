"""``mmptm``: the command line. Thin: each sub-command parses arguments and calls the library.

mmptm data toyworld --out DIR [--n-train N ...] [--views video,audio,speech,...] [--voice V]
mmptm data msrvtt|videos|video-features ... --out DIR
mmptm data clotho|audiocaps|esc50|librispeech ... --out DIR [--sample-rate HZ]
mmptm data typing|relations --input FILE --out DIR [--split train] [--lang en]
mmptm data link --input SHARDS --aliases [LANG=]FILE --out DIR [--case auto] [--field auto]
mmptm kg train-embeddings TRIPLES --out DIR [--model transe|distmult] [--mmap] [--device cuda]
mmptm tokenizer train --input PATH [PATH ...] --out PREFIX [--vocab-size N]
mmptm units fit --shards SPEC (--k K | --levels L --branch B) --out CODEBOOK.npy
                [--audio-features mfcc | --audio-features RUN --layer L]
mmptm recipes [--modality M] [--json]
mmptm pretrain RECIPE [key=value ...]
mmptm finetune RECIPE init=RUN [key=value ...]
mmptm eval retrieval RUN_OR_CHECKPOINT [--split test] [key=value ...]
mmptm eval probe RUN --cloze FILE.jsonl [...] [--candidates FILE] [--group-by facts]
mmptm eval spans RUN [--shards SPEC | --set NAME=SPEC ...] [--group-by facts] [--out FILE]
mmptm eval captioning RUN [--split test] [--lang en] [--beam 3]
mmptm eval translation RUN --src en --tgt de [--split test] [--beam 4]
mmptm generate RUN --image F | --video F | --audio F | --shards SPEC | --text "..." [--lang de]
               [--beam 4] [--sample --top-p 0.9]
mmptm plot RUN [RUN ...] --metric NAME_OR_GLOB [...] --out FILE.png [--smooth 0.6] [--x step]
mmptm index RUN --shards SPEC --out DIR [--add] [--index-type flat|ivf|hnsw]
mmptm retrieve INDEX "a red circle" | --image FILE | --key KEY [-k 10] [--lang de] [--json]
mmptm serve INDEX [--host 127.0.0.1] [--port 8000] [--allow-host NAME] [--device cpu] [--run RUN]
mmptm demo [--out runs/demo] [key=value ...]

One module per command group, each sub-command's parser beside the function it runs. The
``mmptm data`` commands come from the converters' registry (:data:`mmptm.registry.CONVERTERS`).
Flags read their defaults from the library functions they call (``default_of``), so a group
imports its library when it is used (:class:`Parser`'s ``fill``), not for ``mmptm --help``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from mmptm.cli import (
    data,
    demo,
    eval,
    generate,
    imports,
    kg,
    plot,
    recipes,
    search,
    tokenizer,
    train,
    units,
)
from mmptm.version import __version__


class Parser(argparse.ArgumentParser):
    """An argument parser that may add its arguments on first use.

    ``fill(parser)``, if given, runs when the parser first parses or shows its help: a command
    group's flags read their defaults from the library, which only that group's use imports.
    """

    def __init__(
        self, *args: Any, fill: Callable[[argparse.ArgumentParser], None] | None = None, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self._fill = fill

    def _filled(self) -> None:
        fill, self._fill = self._fill, None
        if fill is not None:
            fill(self)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._filled()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._filled()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        # one line, as for every other mistake a user can fix; the usage is one --help away
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``mmptm`` parser: the command groups, in the order ``mmptm --help`` lists them."""
    p = Parser(prog="mmptm", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"mmptm {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = p.add_subparsers(dest="command", required=True)
    groups = (
        data,
        kg,
        imports,
        tokenizer,
        units,
        recipes,
        train,
        eval,
        generate,
        plot,
        search,
        demo,
    )
    for group in groups:
        group.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        status = args.fn(args)
    except (ValueError, OSError, FloatingPointError) as e:
        if args.debug:
            raise
        # What the user can act on (a bad config or input, a full disk or unwritable folder, a
        # non-finite loss, a stalled rank): one clear line, not a traceback (--debug shows it).
        # ConfigError is a ValueError; a stalled rank raises TimeoutError, an OSError.
        message = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"mmptm {args.command}: error: {message or type(e).__name__}", file=sys.stderr)
        status = 2
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a rank under torchrun
        from mmptm.train.trainer import exit_rank

        exit_rank(status)
    return status
