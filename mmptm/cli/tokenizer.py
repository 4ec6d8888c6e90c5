"""``mmptm tokenizer train``: multilingual sentencepiece tokenizers."""

from __future__ import annotations

import argparse

from mmptm.registry import default_of


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm tokenizer ...``."""
    sub.add_parser("tokenizer", help="multilingual sentencepiece tokenizers", fill=_fill)


def _fill(tok: argparse.ArgumentParser) -> None:
    _train(tok.add_subparsers(dest="action", required=True))


def _train(tok_sub: argparse._SubParsersAction) -> None:
    from mmptm.tokenizers.sentencepiece import train_tokenizer as fn

    tt = tok_sub.add_parser("train", help="train from text files or shards")
    tt.add_argument("--input", nargs="+", required=True, help="text files, shards, dirs, globs")
    tt.add_argument("--out", required=True, help="output prefix (writes PREFIX.model/.json)")
    tt.add_argument("--vocab-size", type=int, default=default_of(fn, "vocab_size"))
    tt.add_argument("--languages", default=None, help="comma list (default: found in shards)")
    tt.add_argument("--model-type", default=default_of(fn, "model_type"),
                    choices=["unigram", "bpe"])  # fmt: skip
    tt.add_argument("--seed", type=int, default=default_of(fn, "seed"))
    tt.add_argument(
        "--fit-to-data",
        action="store_true",
        help="bpe: --vocab-size is a cap; stop when every word is one piece",
    )
    tt.set_defaults(fn=_tokenizer_train)


def _tokenizer_train(args: argparse.Namespace) -> int:
    from mmptm.tokenizers.sentencepiece import train_tokenizer

    tok = train_tokenizer(
        args.input,
        args.out,
        vocab_size=args.vocab_size,
        languages=args.languages.split(",") if args.languages else None,
        model_type=args.model_type,
        seed=args.seed,
        fit_to_data=args.fit_to_data,
    )
    print(f"tokenizer → {args.out}.model: {tok}")
    return 0
