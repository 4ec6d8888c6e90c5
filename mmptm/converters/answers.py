"""VQA answer vocabularies: built from the answers of VQA shards, written one answer a line.

``mmptm data answers`` is :func:`shard_answers` → :func:`build_answer_vocab` →
:func:`write_answer_vocab`; the ``vqa`` objective's ``answers`` names the file (read by
``mmptm.models``, which hands the objective the list). Answers are normalised as the official
evaluation does (:func:`~mmptm.objectives.vqa.normalize_answer`), so the vocabulary holds the
strings the soft targets compare.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.models.resources import read_lines
from mmptm.objectives.vqa import normalize_answer
from mmptm.registry import CONVERTERS, default_of


def build_answer_vocab(
    answer_lists: Iterable[Sequence[str]], min_count: int = 9, top_k: int | None = None
) -> list[str]:
    """Answer vocabulary: normalised answers given for at least ``min_count`` questions.

    An answer counts once per question however many annotators gave it, so one question
    cannot put an answer in the vocabulary. Ordered by count (descending), then
    alphabetically; ``top_k`` then keeps the first k (pass ``min_count=1`` for top-k alone).
    """
    counts: Counter[str] = Counter()
    for answers in answer_lists:
        counts.update({normalize_answer(a) for a in answers} - {""})
    ranked = sorted((a for a, c in counts.items() if c >= min_count), key=lambda a: (-counts[a], a))
    return ranked if top_k is None else ranked[:top_k]


def shard_answers(shard_specs: Iterable[str]) -> list[list[str]]:
    """The raw answer lists of the questions in VQA shards (``json["answers"]``), in order.

    Unreadable samples are skipped and counted like in training; a question without
    answers (a test split) gives an empty list.
    """
    handler = SkipCounter()
    lists = []
    for spec in shard_specs:
        for sample in tar_samples(expand_shards(spec), handler):
            if "json" not in sample:
                continue
            try:
                lists.append([str(a) for a in json.loads(sample["json"]).get("answers") or []])
            except (ValueError, AttributeError) as e:
                handler.skip(sample, f"bad json: {e}")
    return lists


def write_answer_vocab(vocab: Sequence[str], path: str | Path) -> None:
    """One answer per line, the format the ``vqa`` objective's ``answers`` names."""
    Path(path).write_text("".join(f"{a}\n" for a in vocab), encoding="utf-8")


def read_answer_vocab(path: str | Path) -> list[str]:
    """The answers of a vocabulary file, in order: the list the ``vqa`` objective is handed."""
    return read_lines(path, "answer vocabulary")


def _answers_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", nargs="+", required=True, help="VQA shards")
    p.add_argument("--out", required=True, help="answers file, one per line")
    p.add_argument("--min-count", type=int, default=default_of(build_answer_vocab, "min_count"),
                   help="questions an answer must occur in")  # fmt: skip
    p.add_argument("--top-k", type=int, default=default_of(build_answer_vocab, "top_k"))


@CONVERTERS.register("answers", "VQA answer vocabulary from training shards", _answers_arguments)
def _answers_command(args: argparse.Namespace) -> int:
    lists = shard_answers(args.input)
    vocab = build_answer_vocab(lists, min_count=args.min_count, top_k=args.top_k)
    write_answer_vocab(vocab, args.out)
    print(f"{len(vocab)} answers (of {len(lists)} questions) → {args.out}")
    return 0


__all__ = ["build_answer_vocab", "read_answer_vocab", "shard_answers", "write_answer_vocab"]
