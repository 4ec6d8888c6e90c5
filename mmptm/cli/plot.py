"""``mmptm plot``: training curves of runs."""

from __future__ import annotations

import argparse

from mmptm.registry import default_of


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm plot``."""
    sub.add_parser("plot", help="draw training curves of runs (their metrics.jsonl)", fill=_fill)


def _fill(pl: argparse.ArgumentParser) -> None:
    from mmptm.eval.curves import X_AXES
    from mmptm.eval.curves import plot_curves as fn

    pl.add_argument("runs", nargs="+", help="run directories (or metrics.jsonl files)")
    pl.add_argument("--metric", action="append", default=[],
                    help="a metric or glob, e.g. contrastive_loss or '*_loss'; repeatable; one "
                    "subplot each (default: '*loss')")  # fmt: skip
    pl.add_argument("--out", required=True, help="image file (.png, .pdf, .svg)")
    pl.add_argument("--smooth", type=float, default=default_of(fn, "smoothing"),
                    help="TensorBoard's smoothing weight in [0, 1); 0 = raw curves")  # fmt: skip
    pl.add_argument("--x", default=default_of(fn, "x"), choices=list(X_AXES),
                    help="x axis: optimiser steps, samples trained on, training time")  # fmt: skip
    pl.add_argument("--log-y", action="store_true", help="logarithmic y axes")
    pl.add_argument("--title", default=default_of(fn, "title"), help="figure title")
    pl.set_defaults(fn=_plot)


def _plot(args: argparse.Namespace) -> int:
    from mmptm.eval.curves import plot_curves

    out = plot_curves(
        args.runs, args.metric or ["*loss"], args.out, smoothing=args.smooth, x=args.x,
        log_y=args.log_y, title=args.title,
    )  # fmt: skip
    print(f"curves of {len(args.runs)} run(s) → {out}")
    return 0
