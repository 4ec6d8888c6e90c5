"""Converters from the text formats corpora ship in to webdataset shards.

Readers for line-aligned parallel corpora (Europarl / OPUS Moses), parallel TSV (Tatoeba /
OPUS), monolingual text (one sentence per line) and NLI TSVs (XNLI 1.0 dev/test, MultiNLI
train, XNLI-MT translate-train). Shard members:

- monolingual: ``txt`` (the sentence), ``json`` = ``{"language": l}``
- parallel: ``json`` = ``{"languages": [l1, l2], "texts": [t1, t2]}``
- NLI: ``json`` = ``{"premise", "hypothesis", "label", "language", "pair_id"}``

Every converter writes through :class:`~mmptm.data.shards.ShardWriter` and returns
``{"written": n, "skipped": {reason: n}, "skipped_lines": {reason: [line, ...]},
"shards": [...]}``: nothing is dropped silently.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from mmptm.converters import print_stats, shard_arguments
from mmptm.data.shards import ShardWriter
from mmptm.registry import CONVERTERS

__all__ = [
    "NLI_LABELS",
    "XNLI_COLUMNS",
    "convert_monolingual",
    "convert_parallel_files",
    "convert_parallel_tsv",
    "convert_xnli",
]

log = logging.getLogger(__name__)
PathLike = str | os.PathLike[str]

NLI_LABELS = ("entailment", "neutral", "contradiction")
# fmt: off
XNLI_COLUMNS = (  # XNLI 1.0 dev/test; MultiNLI has the same without "language"
    "language", "gold_label", "sentence1_binary_parse", "sentence2_binary_parse",
    "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "promptID", "pairID",
    "genre", "label1", "label2", "label3", "label4", "label5",
)
# fmt: on
_LABEL_ALIASES = {"contradictory": "contradiction"}  # XNLI-MT's spelling
_MAX_LINES = 100  # skipped lines / items kept (and warned about) per reason
_CODE = re.compile(r"[A-Za-z0-9_-]+")  # a language code goes into file names and keys


class SkipStats:
    """Counts what a converter wrote and why inputs were skipped, for the log and the caller.

    A skip names where it happened: a line number (``file:line`` in the log) or an item
    such as a file name or question id; the result lists them under ``skipped_<named>``.
    """

    def __init__(self, source: str, named: str = "lines") -> None:
        self.source = source
        self.named = named
        self.written = 0
        self.skipped: dict[str, int] = {}
        self.where: dict[str, list[int | str]] = {}

    def skip(self, reason: str, where: int | str, *, warn: bool = True) -> None:
        n = self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if n <= _MAX_LINES:
            self.where.setdefault(reason, []).append(where)
            if warn:
                sep = ":" if isinstance(where, int) else ": "
                at = f"{self.source}{sep}{where}"
                log.warning("%s: skipped (%s)", at, reason)

    def result(self, shards: list[str], **extra: Any) -> dict[str, Any]:
        summary = f"wrote {self.written} samples in {len(shards)} shards"
        log.info("%s: %s; skipped %s", self.source, summary, self.skipped or "nothing")
        return {
            "written": self.written,
            "skipped": dict(self.skipped),
            f"skipped_{self.named}": {k: list(v) for k, v in self.where.items()},
            "shards": list(shards),
            **extra,
        }


def _code(lang: str) -> str:
    if not isinstance(lang, str) or not _CODE.fullmatch(lang):
        raise ValueError(f"invalid language code {lang!r}: use letters, digits, '_' or '-'")
    return lang


def _lines(path: PathLike) -> Iterator[tuple[int, str]]:
    # newline="\n": a stray '\r' inside a sentence must not split it and shift the alignment
    with open(path, encoding="utf-8", newline="\n") as f:
        for n, line in enumerate(f, 1):
            yield n, line.strip()


def _tsv(path: PathLike) -> Iterator[tuple[int, list[str]]]:
    # QUOTE_NONE: MultiNLI/XNLI sentences hold unbalanced '"', which would swallow lines
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        for row in reader:
            yield reader.line_num, row


def convert_parallel_files(
    src: PathLike,
    tgt: PathLike,
    langs: tuple[str, str],
    out_dir: PathLike,
    *,
    split: str = "train",
    shard_size: int = 10000,
) -> dict[str, Any]:
    """Line-aligned corpora (``corpus.en`` + ``corpus.de``) to ``{split}-{l1}-{l2}-%06d.tar``."""
    l1, l2 = _code(langs[0]), _code(langs[1])
    counts = [sum(1 for _ in _lines(p)) for p in (src, tgt)]
    if counts[0] != counts[1]:
        raise ValueError(f"line counts differ: {src} has {counts[0]} lines, {tgt} has {counts[1]}")
    stats = SkipStats(f"{src} + {tgt}")
    with ShardWriter(Path(out_dir) / f"{split}-{l1}-{l2}-%06d.tar", shard_size) as writer:
        for (n, a), (_, b) in zip(_lines(src), _lines(tgt)):
            if not a or not b:
                stats.skip("empty", n, warn=False)  # common in Moses corpora: counted, not noisy
                continue
            texts = {"languages": [l1, l2], "texts": [a, b]}
            writer.write({"__key__": f"{l1}-{l2}-{n:09d}", "json": texts})
            stats.written += 1
    return stats.result(writer.shards)


def convert_parallel_tsv(
    tsv: PathLike,
    langs: tuple[str, str],
    out_dir: PathLike,
    *,
    split: str = "train",
    shard_size: int = 10000,
) -> dict[str, Any]:
    """Tab-separated pairs (first two columns; Tatoeba / OPUS TSV) to parallel shards."""
    l1, l2 = _code(langs[0]), _code(langs[1])
    stats = SkipStats(os.fspath(tsv))
    with ShardWriter(Path(out_dir) / f"{split}-{l1}-{l2}-%06d.tar", shard_size) as writer:
        for n, row in _tsv(tsv):
            if len(row) < 2:
                stats.skip("malformed", n)
                continue
            a, b = row[0].strip(), row[1].strip()
            if not a or not b:
                stats.skip("empty", n)
                continue
            texts = {"languages": [l1, l2], "texts": [a, b]}
            writer.write({"__key__": f"{l1}-{l2}-{n:09d}", "json": texts})
            stats.written += 1
    return stats.result(writer.shards)


def convert_monolingual(
    path: PathLike,
    lang: str,
    out_dir: PathLike,
    *,
    split: str = "train",
    shard_size: int = 10000,
) -> dict[str, Any]:
    """One sentence per line (blank lines skipped) to ``{split}-{lang}-%06d.tar``."""
    lang = _code(lang)
    stats = SkipStats(os.fspath(path))
    with ShardWriter(Path(out_dir) / f"{split}-{lang}-%06d.tar", shard_size) as writer:
        for n, text in _lines(path):
            if not text:
                stats.skip("empty", n, warn=False)
                continue
            writer.write({"__key__": f"{lang}-{n:09d}", "txt": text, "json": {"language": lang}})
            stats.written += 1
    return stats.result(writer.shards)


def _nli_columns(header: list[str], path: PathLike) -> tuple[str, dict[str, int | None]]:
    """Name the file's format and find its columns by header name."""
    cols = {name.strip(): i for i, name in enumerate(header)}
    if {"gold_label", "sentence1", "sentence2", "pairID"} <= cols.keys():
        names = ("sentence1", "sentence2", "gold_label", "pairID", "language")
        fmt = "xnli" if "language" in cols else "multinli"
    elif {"premise", "hypo", "label"} <= cols.keys():
        names, fmt = ("premise", "hypo", "label", "", ""), "xnli-mt"
    else:
        raise ValueError(
            f"{path}: unknown NLI header, columns {list(cols)}; expected XNLI 1.0 / MultiNLI "
            "(gold_label, sentence1, sentence2, pairID) or XNLI-MT (premise, hypo, label)"
        )
    fields = ("premise", "hypothesis", "label", "pair_id", "language")
    return fmt, {f: cols.get(name) for f, name in zip(fields, names)}


def convert_xnli(
    tsv: PathLike,
    out_dir: PathLike,
    *,
    split: str,
    language: str | None = None,
    shard_size: int = 10000,
) -> dict[str, Any]:
    """XNLI 1.0, MultiNLI or XNLI-MT TSV to ``{split}-{lang}-%06d.tar``, one set per language.

    The format is told by the header. ``language``: the language of files without a language
    column ("en" if not given); for XNLI files, keep only that language. XNLI-MT has no pair
    ids: its line number stands in, the same across its line-aligned translations.
    """
    rows = _tsv(tsv)
    try:
        _, header = next(rows)
    except StopIteration:
        raise ValueError(f"{tsv}: empty file, no NLI header") from None
    fmt, col = _nli_columns(header, tsv)
    need = max(i for i in col.values() if i is not None)
    stats = SkipStats(os.fspath(tsv))
    writers: dict[str, ShardWriter] = {}
    written: dict[str, int] = {}
    seen: dict[str, set[str]] = {}
    with ExitStack() as stack:  # each writer publishes on success and aborts on error
        for n, row in rows:
            if len(row) <= need:
                stats.skip("malformed", n)
                continue
            lang = row[col["language"]].strip() if col["language"] is not None else None
            if lang is None:
                lang = language or "en"
            elif language is not None and lang != language:
                stats.skip("other_language", n, warn=False)
                continue
            label = row[col["label"]].strip().lower()
            label = _LABEL_ALIASES.get(label, label)
            premise, hypothesis = row[col["premise"]].strip(), row[col["hypothesis"]].strip()
            if label == "-":  # no annotator consensus: the standard is to drop these
                stats.skip("no_gold_label", n, warn=False)
                continue
            if label not in NLI_LABELS:
                stats.skip("unknown_label", n)
                continue
            if not premise or not hypothesis:
                stats.skip("empty", n)
                continue
            if not _CODE.fullmatch(lang):
                stats.skip("bad_language", n)
                continue
            pair_id = row[col["pair_id"]].strip() if col["pair_id"] is not None else str(n)
            if lang not in writers:
                pattern = Path(out_dir) / f"{split}-{lang}-%06d.tar"
                writers[lang] = stack.enter_context(ShardWriter(pattern, shard_size))
                written[lang], seen[lang] = 0, set()
            key = base = re.sub(r"[^\w-]", "_", pair_id) or "pair"
            while key in seen[lang]:  # pair ids need not be unique; keys must be
                key = f"{key}_{n}" if key == base else f"{key}_"
            seen[lang].add(key)
            record = {"premise": premise, "hypothesis": hypothesis, "label": label}
            record |= {"language": lang, "pair_id": pair_id}
            writers[lang].write({"__key__": key, "json": record})
            written[lang] += 1
            stats.written += 1
    languages = {k: {"written": written[k], "shards": w.shards} for k, w in writers.items()}
    shards = [p for w in writers.values() for p in w.shards]
    return stats.result(shards, format=fmt, languages=languages)


# --------------------------------------------------------------------------------------------
# mmptm data parallel | text | xnli


def _parallel_arguments(p: argparse.ArgumentParser) -> None:
    shard_arguments(p, convert_parallel_files)
    p.add_argument("--langs", required=True, help="two codes, e.g. en,de")


@CONVERTERS.register(
    "parallel", "parallel text: two line-aligned files (corpus.en corpus.de) or one TSV",
    _parallel_arguments,
)  # fmt: skip
def _parallel_command(args: argparse.Namespace) -> int:
    langs = tuple(args.langs.split(","))
    if len(langs) != 2:
        raise ValueError(f"--langs needs two codes, got {args.langs!r}")
    shards = dict(split=args.split, shard_size=args.shard_size)
    if len(args.input) == 2:
        stats = convert_parallel_files(*args.input, langs, args.out, **shards)
    elif len(args.input) == 1:
        stats = convert_parallel_tsv(args.input[0], langs, args.out, **shards)
    else:
        raise ValueError("--input takes two line-aligned files or one TSV file")
    print_stats(stats)
    return 0


def _text_arguments(p: argparse.ArgumentParser) -> None:
    shard_arguments(p, convert_monolingual)
    p.add_argument("--lang", required=True, default=None, help="code")


@CONVERTERS.register("text", "monolingual text, one sentence per line", _text_arguments)
def _text_command(args: argparse.Namespace) -> int:
    stats = convert_monolingual(
        args.input[0], args.lang, args.out, split=args.split, shard_size=args.shard_size
    )
    print_stats(stats)
    return 0


def _xnli_arguments(p: argparse.ArgumentParser) -> None:
    shard_arguments(p, convert_xnli, split="train")
    p.add_argument("--lang", default=None, help="code (xnli: keep only this language)")


@CONVERTERS.register(
    "xnli", "XNLI 1.0 / MultiNLI / XNLI-MT TSV (format read from the header)", _xnli_arguments
)
def _xnli_command(args: argparse.Namespace) -> int:
    stats = convert_xnli(args.input[0], args.out, split=args.split, language=args.lang,
                         shard_size=args.shard_size)  # fmt: skip
    print_stats(stats)
    return 0
