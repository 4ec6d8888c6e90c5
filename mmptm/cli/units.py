"""``mmptm units fit``: codebooks of discrete units (visual words, HuBERT targets)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmptm.cli.flags import device
from mmptm.registry import default_of


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm units ...``."""
    sub.add_parser("units", help="codebooks of discrete units (visual words, HuBERT)", fill=_fill)


def _fill(un: argparse.ArgumentParser) -> None:
    _fit(un.add_subparsers(dest="action", required=True))


def _fit(un_sub: argparse._SubParsersAction) -> None:
    from mmptm.train.units import fit_audio_codebook, fit_codebook

    uf = un_sub.add_parser("fit", help="k-means (flat or hierarchical) over [T,F] members")
    uf.add_argument("--shards", required=True, help="shard spec (glob, brace, dir, commas)")
    uf.add_argument("--member", default=None,
                    help="the [T,F] array member (npy); with --audio-features the audio member "
                    "(default: the first of flac, wav, ...)")  # fmt: skip
    uf.add_argument("--audio-features", default=None, metavar="mfcc|RUN",
                    help="HuBERT: k-means over MFCC features of audio shards, or over "
                    "a run's audio encoder at --layer (the hubert objective's featurizer)",
                    )  # fmt: skip
    uf.add_argument("--layer", type=int, default=default_of(fit_audio_codebook, "layer"),
                    help="with --audio-features RUN: layer L")  # fmt: skip
    uf.add_argument("--k", type=int, default=None, help="centroids (flat k-means)")
    uf.add_argument("--levels", type=int, default=default_of(fit_codebook, "levels"),
                    help="hierarchical: depth (K = B^L)")  # fmt: skip
    uf.add_argument("--branch", type=int, default=None, help="hierarchical: splits per node")
    uf.add_argument("--max-vectors", type=int, default=default_of(fit_codebook, "max_vectors"),
                    help="uniform sample (0 = all)")  # fmt: skip
    uf.add_argument("--iters", type=int, default=default_of(fit_codebook, "iters"),
                    help="most Lloyd steps per k-means")  # fmt: skip
    uf.add_argument("--seed", type=int, default=default_of(fit_codebook, "seed"))
    uf.add_argument("--device", type=device, default=default_of(fit_codebook, "device"))
    uf.add_argument("--no-progress", action="store_true")
    uf.add_argument("--out", required=True, help="codebook .npy; a .json sidecar beside it")
    uf.set_defaults(fn=_units_fit)


def _units_fit(args: argparse.Namespace) -> int:
    from mmptm.train.units import fit_audio_codebook, fit_codebook

    # --k, --branch and --member left out: each function's own default
    given = {n: getattr(args, n) for n in ("k", "branch", "member") if getattr(args, n)}
    common = dict(
        levels=args.levels, max_vectors=args.max_vectors, iters=args.iters, seed=args.seed,
        device=args.device, progress=not args.no_progress, **given,
    )  # fmt: skip
    if args.audio_features:  # HuBERT: the objective's own featurizer over decoded audio
        record = fit_audio_codebook(args.shards, args.out, features=args.audio_features,
                                    layer=args.layer, **common)  # fmt: skip
    elif args.layer:
        raise ValueError("--layer goes with --audio-features RUN (a teacher run)")
    else:
        record = fit_codebook(args.shards, args.out, **common)
    shown = {k: v for k, v in record.items() if k != "shards"}
    print(f"codebook → {args.out} ({Path(args.out).with_suffix('.json')}): {json.dumps(shown)}")
    return 0
