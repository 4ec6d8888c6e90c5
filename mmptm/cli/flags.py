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


def decoding_arguments(p: argparse.ArgumentParser) -> None:
    """The decoding flags of ``mmptm generate`` and ``mmptm eval captioning|translation``."""
    from mmptm.generate.decoding import DecodeConfig

    d = DecodeConfig()
    p.add_argument("--beam", type=int, default=d.beam, help="beam width (1: greedy)")
    p.add_argument("--max-len", type=int, default=d.max_len, help="new pieces at most")
    p.add_argument("--min-len", type=int, default=d.min_len, help="new pieces at least")
    p.add_argument("--length-penalty", type=float, default=d.length_penalty,
                   help="beam score = log-probability / length ** this")  # fmt: skip
    p.add_argument("--no-repeat-ngram", type=int, default=d.no_repeat_ngram,
                   help="no n-gram of this size twice (0: off)")  # fmt: skip
    p.add_argument("--sample", action="store_true", help="sample instead of searching")
    p.add_argument("--top-p", type=float, default=d.top_p, help="nucleus sampling mass")
    p.add_argument("--top-k", type=int, default=d.top_k)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--seed", type=int, default=d.seed, help="sampling seed")


def decoding_config(args: argparse.Namespace):
    """The ``DecodeConfig`` of the decoding flags (a ValueError names a bad one)."""
    from mmptm.generate.decoding import DecodeConfig

    return DecodeConfig(
        max_len=args.max_len, min_len=args.min_len, beam=args.beam,
        length_penalty=args.length_penalty, sample=args.sample, top_p=args.top_p,
        top_k=args.top_k, temperature=args.temperature, no_repeat_ngram=args.no_repeat_ngram,
        seed=args.seed,
    )  # fmt: skip
