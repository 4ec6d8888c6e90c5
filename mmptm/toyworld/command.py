"""``mmptm data toyworld``: the flags of :func:`~mmptm.toyworld.generate` and the command."""

from __future__ import annotations

import argparse
import time

from mmptm.registry import CONVERTERS, default_of
from mmptm.toyworld import ALL_VIEWS, VIEWS, VOICES, generate


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True)
    p.add_argument("--n-train", type=int, default=default_of(generate, "n_train"))
    p.add_argument("--n-val", type=int, default=default_of(generate, "n_val"))
    p.add_argument("--n-test", type=int, default=default_of(generate, "n_test"))
    p.add_argument("--seed", type=int, default=default_of(generate, "seed"))
    # every language the recipes read (the function's default leaves out es)
    p.add_argument("--languages", default="en,de,fr,ru,es", help="comma list")
    p.add_argument("--image-size", type=int, default=default_of(generate, "image_size"))
    p.add_argument("--shard-size", type=int, default=default_of(generate, "shard_size"))
    p.add_argument("--views", default=None,
                   help="comma list of views to write, e.g. video,video_features,video_qa or "
                        "audio,speech ('default': the image and text views, the default; "
                        "'all')")  # fmt: skip
    p.add_argument("--voice", default=default_of(generate, "voice"), choices=VOICES,
                   help="the speech view's synthesiser: the built-in one, or espeak-ng if "
                        "installed")  # fmt: skip
    p.add_argument("--shared-looks", type=int, default=default_of(generate, "shared_looks"),
                   help="knowledge view: toys per look (1, 2, 3, 5 or 6; 1: each toy its "
                        "own looks)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true")


@CONVERTERS.register("toyworld", "the embedded, seeded toy data set", _arguments)
def _toyworld_command(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    manifest = generate(
        args.out,
        n_train=args.n_train,
        n_val=args.n_val,
        n_test=args.n_test,
        seed=args.seed,
        languages=tuple(args.languages.split(",")),
        image_size=args.image_size,
        shard_size=args.shard_size,
        views=_views(args.views),
        voice=args.voice,
        progress=not args.no_progress,
        shared_looks=args.shared_looks,
    )
    counts = manifest.get("counts", {})
    print(f"toyworld → {args.out}: {counts} in {time.perf_counter() - t0:.1f}s")
    return 0


def _views(spec: str | None) -> tuple[str, ...] | None:
    """--views: a comma list; "default" stands for the default views, "all" for every view."""
    if not spec:
        return None
    out: list[str] = []
    for name in spec.split(","):
        names = {"default": list(VIEWS), "all": list(ALL_VIEWS)}.get(name.strip(), [name.strip()])
        out += [n for n in names if n not in out]
    return tuple(out)
