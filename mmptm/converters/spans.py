"""Converters for span tasks: entity typing (Open Entity) and relation classification
(TACRED, FewRel) to text shards whose ``json`` carries character spans.

Inputs (tokenised sentences, the layouts the data sets ship in):

- **Open Entity** (Choi et al. 2018), one JSON object per line (or a JSON list):
  ``{"left_context_token": [...], "mention_span": "...", "right_context_token": [...],
  "y_str": [types]}``, optionally ``entity`` (an entity id) and ``facts``.
- **TACRED**, a JSON list: ``{"id", "token": [...], "subj_start", "subj_end", "obj_start",
  "obj_end", "relation"}`` (inclusive token indices), optionally ``subj_id`` / ``obj_id``
  (entity ids) and ``facts``.
- **FewRel**, a JSON object ``{relation: [{"tokens": [...], "h": [name, id, [[i, ...]]],
  "t": [...]}, ...]}`` (the mention's token indices; its first occurrence is used).

Each item becomes a sample: ``txt`` = the detokenised sentence (:func:`detokenize`) and
``json`` = ``{"language", "labels": [names], <span>: [[char_start, char_end, 0]], "id"}`` with
span ``mention`` (typing) or ``subj`` and ``obj`` (relations), where ``txt[start:end]`` is the
mention as written; ``mentions`` (the ``mmptm data link`` format, ``[[start, end,
entity_id]]``) when the item names its entities, and ``facts`` when present. A malformed item
is a ``ValueError`` naming the file and the item's index.

**Label vocabulary**: converting the ``train`` split writes ``labels.txt`` beside the shards
(one label per line, sorted); the other splits count the items whose labels it lacks
(``unknown_labels`` in the summary). The task heads read it (``labels:`` in the recipe).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from mmptm.data.shards import ShardWriter
from mmptm.modalities.labels import read_labels
from mmptm.registry import CONVERTERS, default_of

PathLike = str | os.PathLike[str]
#: the label vocabulary a train split writes beside its shards
LABELS_FILE = "labels.txt"

# PTB escapes TACRED's tokens carry
_PTB = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}",
        "``": '"', "''": '"'}  # fmt: skip
_NO_SPACE_BEFORE = {".", ",", ";", ":", "!", "?", "%", ")", "]", "}", "'s", "'S", "n't", "'re",
                    "'ve", "'ll", "'d", "'m"}  # fmt: skip
_NO_SPACE_AFTER = {"(", "[", "{", "$"}


def detokenize(tokens: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    """A sentence from its tokens and each token's character span ``[start, end)`` in it:
    PTB escapes undone, no space before closing punctuation and clitics ("'s", "n't") or
    after opening brackets; otherwise one space."""
    text, spans = "", []
    glue = True
    for raw in tokens:
        tok = _PTB.get(raw, raw)
        if text and not glue and tok not in _NO_SPACE_BEFORE:
            text += " "
        spans.append((len(text), len(text) + len(tok)))
        text += tok
        glue = tok in _NO_SPACE_AFTER
    return text, spans


def _read_json_items(path: PathLike) -> Any:
    """A JSON document, or JSON lines as a list."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
    return items


def _tokens(item: dict, key: str, where: str) -> list[str]:
    toks = item.get(key)
    if not isinstance(toks, list) or not all(isinstance(t, str) for t in toks):
        raise ValueError(f"{where}: {key!r} must be a list of strings")
    return toks


def _span(spans: list[tuple[int, int]], first: int, last: int, what: str, where: str) -> list:
    if not (isinstance(first, int) and isinstance(last, int) and 0 <= first <= last < len(spans)):
        raise ValueError(f"{where}: {what} tokens {first}..{last} are outside the sentence")
    return [spans[first][0], spans[last][1]]


def typing_samples(path: PathLike, language: str = "en") -> Iterator[dict[str, Any]]:
    """Open Entity items as sample dicts (``__key__``, ``txt``, ``json``)."""
    items = _read_json_items(path)
    if isinstance(items, dict):  # a file of one line
        items = [items]
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected Open Entity lines (one JSON object per line)")
    for i, item in enumerate(items):
        where = f"{path}: item {i}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a JSON object")
        left = _tokens(item, "left_context_token", where)
        right = _tokens(item, "right_context_token", where)
        mention = item.get("mention_span")
        if not isinstance(mention, str) or not mention.split():
            raise ValueError(f"{where}: 'mention_span' must be a non-empty string")
        types = item.get("y_str")
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ValueError(f"{where}: 'y_str' must be a list of type names")
        words = mention.split()
        text, spans = detokenize([*left, *words, *right])
        span = _span(spans, len(left), len(left) + len(words) - 1, "mention", where)
        meta: dict[str, Any] = {"language": language, "labels": types, "mention": [[*span, 0]]}
        if item.get("entity") is not None:
            meta["mentions"] = [[*span, item["entity"]]]
        yield _sample(i, item, text, meta, item.get("annot_id"))


def relation_samples(path: PathLike, language: str = "en") -> Iterator[dict[str, Any]]:
    """TACRED (a list) or FewRel (``{relation: [items]}``) items as sample dicts."""
    data = _read_json_items(path)
    if isinstance(data, dict):  # FewRel
        items = [(rel, it) for rel, its in data.items() for it in (its or [])]
    elif isinstance(data, list):
        items = [(None, it) for it in data]
    else:
        raise ValueError(f"{path}: expected a TACRED list or a FewRel {{relation: [items]}}")
    for i, (rel, item) in enumerate(items):
        where = f"{path}: item {i}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a JSON object")
        if rel is None:
            text, spans = detokenize(_tokens(item, "token", where))
            subj = _span(spans, item.get("subj_start"), item.get("subj_end"), "subject", where)
            obj = _span(spans, item.get("obj_start"), item.get("obj_end"), "object", where)
            rel, ids = item.get("relation"), (item.get("subj_id"), item.get("obj_id"))
            if not isinstance(rel, str) or not rel:
                raise ValueError(f"{where}: 'relation' must be a non-empty string")
        else:
            text, spans = detokenize(_tokens(item, "tokens", where))
            subj, sid = _fewrel_span(item.get("h"), spans, "h", where)
            obj, oid = _fewrel_span(item.get("t"), spans, "t", where)
            ids = (sid, oid)
        meta: dict[str, Any] = {"language": language, "labels": [rel],
                                "subj": [[*subj, 0]], "obj": [[*obj, 0]]}  # fmt: skip
        mentions = [[*s, e] for s, e in zip((subj, obj), ids) if e is not None]
        if mentions:
            meta["mentions"] = mentions
        yield _sample(i, item, text, meta, item.get("id"))


def _fewrel_span(value: Any, spans: list, name: str, where: str) -> tuple[list, Any]:
    ok = isinstance(value, list) and len(value) == 3 and isinstance(value[2], list)
    ok = ok and bool(value[2]) and isinstance(value[2][0], list) and bool(value[2][0])
    if not ok:
        raise ValueError(f"{where}: {name!r} must be [name, id, [[token indices], ...]]")
    idx = value[2][0]
    if not all(isinstance(t, int) for t in idx):
        raise ValueError(f"{where}: {name!r} token indices must be integers")
    return _span(spans, min(idx), max(idx), name, where), value[1]


def _sample(i: int, item: dict, text: str, meta: dict, item_id: Any) -> dict[str, Any]:
    if item.get("facts") is not None:
        meta["facts"] = item["facts"]
    if item_id is not None:
        meta["id"] = item_id
    return {"__key__": f"{i:08d}", "txt": text, "json": meta}


def convert_spans(
    task: str,
    input: PathLike,
    out: PathLike,
    *,
    split: str = "",
    language: str = "en",
    shard_size: int = 10000,
) -> dict[str, Any]:
    """Convert a ``typing`` or ``relations`` file to ``out/{split}-%06d.tar`` (split: default
    the file's stem, ``train.json`` → ``train``); see the module docstring."""
    read = {"typing": typing_samples, "relations": relation_samples}.get(task)
    if read is None:
        raise ValueError(f"unknown span task {task!r} (typing, relations)")
    split = split or Path(input).name.split(".")[0]
    samples = list(read(input, language))  # all checked before anything is written
    if not samples:
        raise ValueError(f"{input}: no items")
    counts = Counter(label for s in samples for label in s["json"]["labels"])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab_path = out / LABELS_FILE
    stats: dict[str, Any] = {"written": len(samples), "split": split, "labels": len(counts)}
    if split == "train":
        vocab_path.write_text("".join(f"{label}\n" for label in sorted(counts)), encoding="utf-8")
        stats["label_vocabulary"] = str(vocab_path)
    elif vocab_path.exists():
        known = set(read_labels(vocab_path))
        stats["unknown_labels"] = sum(
            any(label not in known for label in s["json"]["labels"]) for s in samples
        )
    with ShardWriter(out / f"{split}-%06d.tar", shard_size) as w:
        for s in samples:
            w.write(s)
    stats["shards"] = w.shards
    stats["with_entities"] = sum("mentions" in s["json"] for s in samples)
    return stats


# --------------------------------------------------------------------------------------------
# mmptm data typing | relations


def _span_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="train.json, dev.json or test.json")
    p.add_argument("--out", required=True, help="shards + labels.txt (from the train split)")
    p.add_argument("--split", default=default_of(convert_spans, "split"),
                   help="default: the file's stem (train.json: train)")  # fmt: skip
    p.add_argument("--lang", default=default_of(convert_spans, "language"))
    p.add_argument("--shard-size", type=int, default=default_of(convert_spans, "shard_size"))


def _span_command(task: str, args: argparse.Namespace) -> int:
    stats = convert_spans(task, args.input, args.out, split=args.split, language=args.lang,
                          shard_size=args.shard_size)  # fmt: skip
    print(json.dumps(stats, indent=1))
    return 0


@CONVERTERS.register(
    "typing", "entity typing: Open Entity lines (contexts, mention, y_str types)", _span_arguments
)
def _typing_command(args: argparse.Namespace) -> int:
    return _span_command("typing", args)


@CONVERTERS.register(
    "relations", "relation classification: a TACRED list or a FewRel {relation: [items]}",
    _span_arguments,
)  # fmt: skip
def _relations_command(args: argparse.Namespace) -> int:
    return _span_command("relations", args)


__all__ = [
    "LABELS_FILE",
    "convert_spans",
    "detokenize",
    "relation_samples",
    "typing_samples",
]
