"""Converters for token tagging: CoNLL-style files (WikiANN, CoNLL-2003) and UD's CoNLL-U to
text shards whose ``json`` annotates every word as a character span.

Inputs:

- **CoNLL** (``mmptm data conll``): one word per line, its columns split by tabs (by spaces
  when the line has none); the first column is the word, the last its tag, so WikiANN's
  ``word<TAB>tag`` and CoNLL-2003's four columns both read. A blank line ends a sentence;
  ``-DOCSTART-`` lines are skipped; WikiANN's raw files prefix every word with its language
  (``en:Paris``): a ``<lang>:`` prefix is dropped.
- **CoNLL-U** (``mmptm data conllu``, Universal Dependencies): ten tab-separated columns;
  ``#`` comments (``# sent_id = ...`` is kept as the sample's ``id``), multiword-token
  ranges (``1-2``) and empty nodes (``1.1``) are skipped, the tag is the ``UPOS`` column
  (``--column xpos``: ``XPOS``). Sentences whose words are withheld (every form, or all but
  one, is ``_``, as in treebanks distributed without their text) are skipped and counted, as
  XTREME does.

Each sentence becomes a sample: ``txt`` = its words joined by single spaces and ``json`` =
``{"language", "words": [[start, end, i], ...], "tags": [[start, end, tag], ...], "line"}``
(``txt[start:end]`` is word i; ``line``: where the sentence starts in the file), what the
``token_tagging`` head reads (:mod:`mmptm.objectives.tagging`). A malformed line is a
``ValueError`` naming the file and the line, before anything is written.

**Tag vocabulary**: converting a ``train`` split writes ``labels.txt`` beside the shards (as
``mmptm data typing`` does: one tag per line, sorted; tags of an earlier train split there
are kept), the other splits count the sentences with tags it lacks (``unknown_labels``).
Shards are ``{split}-{lang}-%06d.tar``, so every language of a split is one pattern
(``test-{lang}-*.tar``) for zero-shot evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mmptm.converters.spans import LABELS_FILE
from mmptm.data.shards import ShardWriter
from mmptm.modalities.labels import read_labels
from mmptm.registry import CONVERTERS, default_of

PathLike = str | os.PathLike[str]
#: a sentence read from a file: (its first line, words, tags, extra json fields)
Sentence = tuple[int, list[str], list[str], dict[str, Any]]

FORMATS = ("conll", "conllu")
#: CoNLL-U's columns the tag may come from
CONLLU_COLUMNS = {"upos": 3, "xpos": 4}
_SPLITS = ("train", "dev", "test", "validation", "val")
_CODE = re.compile(r"[A-Za-z0-9_-]+")


def _lines(path: PathLike) -> Iterator[tuple[int, str]]:
    # newline="\n": a stray '\r' inside a word must not split its line
    with open(path, encoding="utf-8-sig", newline="\n") as f:
        for n, line in enumerate(f, 1):
            yield n, line.rstrip("\r\n")


def conll_sentences(path: PathLike, language: str = "") -> Iterator[Sentence]:
    """The sentences of a CoNLL-style file (module docstring)."""
    prefix = f"{language}:" if language else None
    words: list[str] = []
    tags: list[str] = []
    start = 0
    for n, line in _lines(path):
        if not line.strip():
            if words:
                yield start, words, tags, {}
            words, tags = [], []
            continue
        cols = line.split("\t") if "\t" in line else line.split()
        if cols[0] == "-DOCSTART-":
            continue
        word, tag = cols[0].strip(), cols[-1].strip()
        if len(cols) < 2 or not word or not tag:
            raise ValueError(f"{path}:{n}: expected 'word<TAB>tag', got {line!r}")
        if prefix and word.startswith(prefix) and len(word) > len(prefix):
            word = word[len(prefix) :]
        start = start if words else n
        words.append(word)
        tags.append(tag)
    if words:
        yield start, words, tags, {}


def conllu_sentences(
    path: PathLike, column: str = "upos", skipped: Counter[str] | None = None
) -> Iterator[Sentence]:
    """The sentences of a CoNLL-U file, tagged by ``column`` (module docstring); sentences
    without their text are counted in ``skipped["no_text"]``."""
    if column not in CONLLU_COLUMNS:
        raise ValueError(f"unknown CoNLL-U tag column {column!r} ({', '.join(CONLLU_COLUMNS)})")
    at = CONLLU_COLUMNS[column]
    words: list[str] = []
    tags: list[str] = []
    extra: dict[str, Any] = {}
    start = 0

    def done() -> Iterator[Sentence]:
        withheld = sum(w == "_" for w in words)
        if withheld and withheld >= len(words) - 1:  # XTREME's test: text not distributed
            if skipped is not None:
                skipped["no_text"] += 1
        elif words:
            yield start, words, tags, extra

    for n, line in _lines(path):
        if not line.strip():
            yield from done()
            words, tags, extra = [], [], {}
            continue
        if line.startswith("#"):
            key, _, value = line[1:].partition("=")
            if key.strip() == "sent_id" and not words:
                extra = {"id": value.strip()}
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise ValueError(f"{path}:{n}: a CoNLL-U word line has 10 tab-separated columns, "
                             f"this one {len(cols)}")  # fmt: skip
        token_id = cols[0]
        if "-" in token_id or "." in token_id:  # a multiword token's range, an empty node
            continue
        if not token_id.isdigit():
            raise ValueError(f"{path}:{n}: ID {token_id!r} is not a word index")
        if not cols[1] or not cols[at]:
            raise ValueError(f"{path}:{n}: empty FORM or {column.upper()}")
        start = start if words else n
        words.append(cols[1])
        tags.append(cols[at])
    yield from done()


def tagging_sample(
    key: str, words: list[str], tags: list[str], language: str, extra: dict[str, Any]
) -> dict[str, Any]:
    """A sample: the words joined by spaces, each word and its tag as a character span."""
    spans, at = [], 0
    for w in words:
        spans.append((at, at + len(w)))
        at += len(w) + 1
    meta = {
        "language": language,
        "words": [[a, b, i] for i, (a, b) in enumerate(spans)],
        "tags": [[a, b, t] for (a, b), t in zip(spans, tags)],
        **extra,
    }
    return {"__key__": key, "txt": " ".join(words), "json": meta}


def split_of(path: PathLike) -> str:
    """The split a file's name says (``en_ewt-ud-train.conllu`` → train), else an error."""
    parts = set(re.split(r"[-_.\s]+", Path(path).name.lower()))
    found = [s for s in _SPLITS if s in parts]
    if len(found) != 1:
        raise ValueError(f"{path}: cannot tell the split from the file name; give --split")
    return found[0]


def convert_tagging(
    fmt: str,
    input: PathLike,
    out: PathLike,
    *,
    language: str,
    split: str = "",
    column: str = "upos",
    shard_size: int = 10000,
) -> dict[str, Any]:
    """Convert a ``conll`` or ``conllu`` file to ``out/{split}-{language}-%06d.tar`` (split:
    default from the file name); see the module docstring."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown tagging format {fmt!r} ({', '.join(FORMATS)})")
    if not isinstance(language, str) or not _CODE.fullmatch(language):
        raise ValueError(f"invalid language code {language!r}: use letters, digits, '_' or '-'")
    split = split or split_of(input)
    skipped: Counter[str] = Counter()
    if fmt == "conll":
        read = conll_sentences(input, language)
    else:
        read = conllu_sentences(input, column, skipped)
    samples = [  # all checked before anything is written
        tagging_sample(f"{language}-{i:08d}", words, tags, language, {**extra, "line": line})
        for i, (line, words, tags, extra) in enumerate(read)
    ]
    if not samples:
        raise ValueError(f"{input}: no sentences")
    counts = Counter(t[2] for s in samples for t in s["json"]["tags"])
    stats: dict[str, Any] = {"written": len(samples), "split": split, "language": language,
                             "words": sum(counts.values()), "tags": len(counts),
                             "skipped": dict(skipped)}  # fmt: skip
    stats |= _vocabulary(Path(out), split, counts, samples)
    with ShardWriter(Path(out) / f"{split}-{language}-%06d.tar", shard_size) as w:
        for s in samples:
            w.write(s)
    stats["shards"] = w.shards
    return stats


def _vocabulary(out: Path, split: str, counts: Counter[str], samples: list) -> dict[str, Any]:
    """Write (train) or check against (other splits) the tag vocabulary beside the shards."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / LABELS_FILE
    known = set(read_labels(path)) if path.exists() else set()
    if split == "train":
        path.write_text("".join(f"{t}\n" for t in sorted(known | set(counts))), encoding="utf-8")
        return {"label_vocabulary": str(path)}
    if not known:
        return {}
    unknown = sum(any(t[2] not in known for t in s["json"]["tags"]) for s in samples)
    return {"unknown_labels": unknown}


# --------------------------------------------------------------------------------------------
# mmptm data conll | conllu


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="one file of one split and language")
    p.add_argument("--out", required=True, help="shards + labels.txt (from the train split)")
    p.add_argument("--lang", required=True, help="the file's language code")
    p.add_argument("--split", default=default_of(convert_tagging, "split"),
                   help="default: from the file name (train, dev, test)")  # fmt: skip
    p.add_argument("--shard-size", type=int, default=default_of(convert_tagging, "shard_size"))


def _conllu_arguments(p: argparse.ArgumentParser) -> None:
    _arguments(p)
    p.add_argument("--column", default=default_of(convert_tagging, "column"),
                   choices=list(CONLLU_COLUMNS), help="the tag column")  # fmt: skip


def _run(fmt: str, args: argparse.Namespace) -> int:
    stats = convert_tagging(fmt, args.input, args.out, language=args.lang, split=args.split,
                            column=getattr(args, "column", "upos"),
                            shard_size=args.shard_size)  # fmt: skip
    print(json.dumps(stats, indent=1))
    return 0


@CONVERTERS.register(
    "conll", "token tagging: CoNLL-style word<TAB>tag lines (WikiANN NER, CoNLL-2003)", _arguments
)
def _conll_command(args: argparse.Namespace) -> int:
    return _run("conll", args)


@CONVERTERS.register(
    "conllu", "token tagging: Universal Dependencies CoNLL-U (UPOS or XPOS)", _conllu_arguments
)
def _conllu_command(args: argparse.Namespace) -> int:
    return _run("conllu", args)


__all__ = [
    "CONLLU_COLUMNS",
    "FORMATS",
    "conll_sentences",
    "conllu_sentences",
    "convert_tagging",
    "split_of",
    "tagging_sample",
]
