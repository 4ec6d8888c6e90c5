"""Converter for extractive QA in SQuAD's JSON (SQuAD v1.1, XQuAD, MLQA, TyDiQA-GoldP) to text
shards, one sample per question.

Input: ``{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
"answers": [{"text", "answer_start"}], "is_impossible"?}]}]}]}``. A sample's ``json`` is the
text pair the ``extractive_qa`` head reads (:mod:`mmptm.objectives.qa`): ``premise`` = the
question, ``hypothesis`` = the context, ``answer`` = ``{"hypothesis": [[start, end, 0]]}``
(the first gold answer whose text is found in the context, the training target),
``context_span`` = ``{"hypothesis": [[0, len(context), 0]]}``, and for evaluation
``answers`` (every gold ``{"text", "answer_start"}``), ``id``, ``title``, ``language``.

An answer's ``answer_start`` is trusted when the context holds its text there; otherwise the
occurrence nearest to it is used (``moved_answers`` counts them) and an answer whose text the
context lacks is kept for scoring only (``answers_not_in_context``). Questions marked
``is_impossible`` (SQuAD 2.0) or without any answer, and those of an empty context, are
skipped and counted. A malformed
entry (a missing or mistyped field) is a ``ValueError`` naming the file and the entry
(``data[0].paragraphs[3].qas[1]``), before anything is written. Shards are
``{split}-{lang}-%06d.tar`` (split: default from the file name, e.g. ``dev-v1.1.json``).
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

from mmptm.converters.tagging import split_of
from mmptm.data.shards import ShardWriter
from mmptm.registry import CONVERTERS, default_of

PathLike = str | os.PathLike[str]
_CODE = re.compile(r"[A-Za-z0-9_-]+")


def _field(entry: Any, key: str, kind: type, where: str) -> Any:
    value = entry.get(key) if isinstance(entry, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        name = {str: "a string", list: "a list", int: "an integer"}[kind]
        raise ValueError(f"{where}: {key!r} must be {name}")
    return value


def _locate(context: str, text: str, start: int) -> int | None:
    """Where ``text`` is in ``context``: at ``start`` if it is there, else the occurrence
    nearest to it; None when the context lacks it."""
    if context[start : start + len(text)] == text:
        return start
    hits = [m.start() for m in re.finditer(re.escape(text), context)]
    return min(hits, key=lambda h: abs(h - start)) if hits else None


def squad_samples(
    path: PathLike, language: str, counts: Counter[str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(question id, sample json) of every answerable question (module docstring)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
    articles = _field(doc, "data", list, f"{path}")
    for i, article in enumerate(articles):
        where = f"{path}: data[{i}]"
        title = article.get("title", "") if isinstance(article, dict) else ""
        for j, para in enumerate(_field(article, "paragraphs", list, where)):
            at = f"{where}.paragraphs[{j}]"
            context = _field(para, "context", str, at)
            for k, qa in enumerate(_field(para, "qas", list, at)):
                sample = _question(qa, context, f"{at}.qas[{k}]", counts)
                if sample is not None:
                    qid, meta = sample
                    yield qid, {**meta, "title": str(title), "language": language}


def _question(
    qa: Any, context: str, where: str, counts: Counter[str]
) -> tuple[str, dict[str, Any]] | None:
    question = _field(qa, "question", str, where).strip()
    qid = qa.get("id")
    if not question or not isinstance(qid, (str, int)) or isinstance(qid, bool):
        raise ValueError(f"{where}: needs a non-empty 'question' and an 'id'")
    answers = _field(qa, "answers", list, where) if "answers" in qa else []
    if qa.get("is_impossible") or not answers:
        counts["unanswerable"] += 1
        return None
    if not context.strip():
        counts["empty_context"] += 1
        return None
    gold, spans = [], []
    for n, a in enumerate(answers):
        text = _field(a, "text", str, f"{where}.answers[{n}]")
        start = _field(a, "answer_start", int, f"{where}.answers[{n}]")
        gold.append({"text": text, "answer_start": start})
        found = _locate(context, text, start) if text.strip() else None
        if found is None:
            counts["answers_not_in_context"] += 1
            continue
        counts["moved_answers"] += found != start
        spans.append([found, found + len(text), 0])
    meta = {
        "premise": question,
        "hypothesis": context,
        "answer": {"hypothesis": spans[:1]},  # the first: training's target
        "context_span": {"hypothesis": [[0, len(context), 0]]},
        "answers": gold,
        "id": str(qid),
    }
    return str(qid), meta


def convert_squad(
    input: PathLike, out: PathLike, *, language: str, split: str = "", shard_size: int = 10000
) -> dict[str, Any]:
    """Convert a SQuAD-format file to ``out/{split}-{language}-%06d.tar`` (module docstring)."""
    if not isinstance(language, str) or not _CODE.fullmatch(language):
        raise ValueError(f"invalid language code {language!r}: use letters, digits, '_' or '-'")
    split = split or split_of(input)
    counts: Counter[str] = Counter()
    samples, seen = [], set()
    for qid, meta in squad_samples(input, language, counts):  # all checked before writing
        key = base = re.sub(r"[^\w-]", "_", qid) or "q"  # a key holds no '.'
        n = 0
        while key in seen:  # ids need not be unique; keys must be
            n += 1
            key = f"{base}_{n}"
        seen.add(key)
        samples.append({"__key__": key, "json": meta})
    if not samples:
        raise ValueError(f"{input}: no answerable questions")
    with ShardWriter(Path(out) / f"{split}-{language}-%06d.tar", shard_size) as w:
        for s in samples:
            w.write(s)
    return {"written": len(samples), "split": split, "language": language,
            "skipped": {k: counts[k] for k in ("unanswerable", "empty_context") if counts[k]},
            "moved_answers": counts["moved_answers"],
            "answers_not_in_context": counts["answers_not_in_context"],
            "shards": w.shards}  # fmt: skip


# --------------------------------------------------------------------------------------------
# mmptm data squad


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, help="a SQuAD-format JSON file")
    p.add_argument("--out", required=True)
    p.add_argument("--lang", required=True, help="the questions' language code")
    p.add_argument("--split", default=default_of(convert_squad, "split"),
                   help="default: from the file name (train, dev, test)")  # fmt: skip
    p.add_argument("--shard-size", type=int, default=default_of(convert_squad, "shard_size"))


@CONVERTERS.register(
    "squad", "extractive QA: SQuAD-format JSON (SQuAD, XQuAD, MLQA, TyDiQA-GoldP)", _arguments
)
def _squad_command(args: argparse.Namespace) -> int:
    stats = convert_squad(args.input, args.out, language=args.lang, split=args.split,
                          shard_size=args.shard_size)  # fmt: skip
    print(json.dumps(stats, indent=1))
    return 0


__all__ = ["convert_squad", "squad_samples"]
