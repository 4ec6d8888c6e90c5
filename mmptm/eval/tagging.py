"""Evaluation of a token tagger (``token_tagging``): span F1 as seqeval computes it, accuracy.

**Span F1** (named entities; what XTREME reports for WikiANN, through seqeval 1.2's default
mode): the sentences are read as one sequence with an "O" between them; a chunk (type, first
word, last word) ends and starts where seqeval's ``end_of_chunk`` / ``start_of_chunk`` say,
which also reads malformed BIO the way seqeval does (an I- without a B- starts a chunk; a
type change inside a chunk splits it; E-/S- tags are read as IOBES). Precision = right chunks
/ predicted chunks, recall = right / gold, F1 their harmonic mean, micro over types, 0 when
undefined. **Accuracy** (parts of speech, XTREME's UD-POS): right words / words.

A word the model gives no prediction (its first piece cut off by ``max_len``) counts as
predicted "O" for span F1 and as wrong for accuracy (``unpredicted_words`` counts them);
gold tags come from the shards' json, so tags the run's vocabulary lacks count as missed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

from mmptm.batch import END, KEY, move_to
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.tagging import TokenTagging

#: a chunk: (type, first word, last word) in the joined sequence
Chunk = tuple[str, int, int]


def _split(tag: str) -> tuple[str, str]:
    """(prefix letter, type) of a tag as seqeval splits it (no suffix mode): "B-PER" →
    ("B", "PER"), "O" → ("O", "_")."""
    return tag[0], tag[1:].split("-", maxsplit=1)[-1] or "_"


def _ends(prev: str, tag: str, prev_type: str, type_: str) -> bool:
    """seqeval's ``end_of_chunk``: a chunk ended between the previous word and this one."""
    if prev in ("E", "S"):
        return True
    if prev in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev not in ("O", ".") and prev_type != type_


def _starts(prev: str, tag: str, prev_type: str, type_: str) -> bool:
    """seqeval's ``start_of_chunk``: a chunk starts at this word."""
    if tag in ("B", "S"):
        return True
    if tag in ("E", "I") and prev in ("E", "S", "O"):
        return True
    return tag not in ("O", ".") and prev_type != type_


def chunks(sentences: Sequence[Sequence[str]]) -> list[Chunk]:
    """The chunks of sentences of tags, joined with an "O" between them (module docstring)."""
    seq = [t for s in sentences for t in (*s, "O")]
    out: list[Chunk] = []
    prev, prev_type, begin = "O", "", 0
    for i, t in enumerate([*seq, "O"]):
        tag, type_ = _split(t)
        if _ends(prev, tag, prev_type, type_):
            out.append((prev_type, begin, i - 1))
        if _starts(prev, tag, prev_type, type_):
            begin = i
        prev, prev_type = tag, type_
    return out


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def span_scores(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro precision / recall / F1 of the predicted chunks (seqeval's ``precision_score``,
    ``recall_score``, ``f1_score`` with their defaults)."""
    _check_lengths(gold, pred)
    want, got = set(chunks(gold)), set(chunks(pred))
    right = len(want & got)
    p = right / len(got) if got else 0.0
    r = right / len(want) if want else 0.0
    return {"p": p, "r": r, "f1": _f1(p, r)}


def word_accuracy(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str | None]]) -> float:
    """Right words / words (seqeval's ``accuracy_score``); 0 without words."""
    _check_lengths(gold, pred)
    pairs = [(g, p) for gs, ps in zip(gold, pred) for g, p in zip(gs, ps)]
    return sum(g == p for g, p in pairs) / len(pairs) if pairs else 0.0


def _check_lengths(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[Any]]) -> None:
    if len(gold) != len(pred) or any(len(g) != len(p) for g, p in zip(gold, pred)):
        raise ValueError("gold and predicted tags differ in sentences or words")


def tagging_scores(
    gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str | None]], scheme: str
) -> dict[str, float]:
    """Accuracy, and for ``scheme="bio"`` span precision / recall / F1; ``None`` in ``pred``
    is a word without a prediction ("O" for chunks, wrong for accuracy)."""
    out: dict[str, float] = {}
    if scheme == "bio":
        out |= span_scores(gold, [[p or "O" for p in s] for s in pred])
    out["acc"] = word_accuracy(gold, pred)
    return out


def tagging_head(model: PretrainModel) -> TokenTagging | None:
    """The model's token tagging head, or None."""
    return next((o for o in model.objectives.values() if isinstance(o, TokenTagging)), None)


def read_gold(shards: str, field: str = "tags") -> dict[str, list[str]]:
    """Per sample key: the gold tags in word order, from each json's tag spans (``field``)."""
    out: dict[str, list[str]] = {}
    for s in tar_samples(expand_shards(shards), SkipCounter()):
        try:
            spans = json.loads(s.get("json", b"{}")).get(field)
        except (ValueError, AttributeError):
            continue  # the stream skips and counts it too
        if not isinstance(spans, list):
            continue
        out[s[KEY]] = [str(t[2]) for t in sorted(spans, key=lambda t: t[0])]
    return out


@torch.no_grad()
def predict_tags(
    model: PretrainModel, cfg: Any, tokenizer: Any, shards: str, device: str = "cpu"
) -> tuple[TokenTagging, dict[str, dict[int, str]]]:
    """The head and, per sample key, its predicted tag of each word with a first piece."""
    head = tagging_head(model)
    if head is None:
        raise ValueError("the run has no token_tagging head: fine-tune one first")
    model.eval().to(device)
    stream = stream_config(
        cfg.data, tokenizer, split="test", shards=shards, needs=model.data_needs(), seed=cfg.seed
    )
    out: dict[str, dict[int, str]] = {}
    for batch in single_pass(stream):
        if END in batch:
            continue
        keys = list(batch[KEY])
        batch = move_to(batch, device)
        rows, words, tags = (t.tolist() for t in head.word_predictions(model.fuse(batch), batch))
        for key in keys:
            out.setdefault(key, {})
        for r, w, t in zip(rows, words, tags):
            out[keys[r]][w] = head.labels[t]
    return head, out


def evaluate_tagging_set(
    model: PretrainModel, cfg: Any, tokenizer: Any, shards: str, device: str = "cpu"
) -> dict[str, Any]:
    """The head's scores on ``shards``: ``n`` (sentences), ``words``, ``acc`` and, for BIO
    tags, ``p`` / ``r`` / ``f1``, with ``unpredicted_words``."""
    head, predicted = predict_tags(model, cfg, tokenizer, shards, device)
    gold_by_key = read_gold(shards, head.cfg.tags)
    if not gold_by_key:
        raise ValueError(f"{shards}: no samples with {head.cfg.tags!r} spans")
    gold, pred = [], []
    for key, tags in gold_by_key.items():
        got = predicted.get(key, {})
        gold.append(tags)
        pred.append([got.get(i) for i in range(len(tags))])
    result: dict[str, Any] = {"n": len(gold), "words": sum(map(len, gold))}
    result |= tagging_scores(gold, pred, head.scheme)
    result["unpredicted_words"] = sum(p is None for s in pred for p in s)
    result["scheme"] = head.scheme
    return result


__all__ = [
    "chunks",
    "evaluate_tagging_set",
    "predict_tags",
    "read_gold",
    "span_scores",
    "tagging_head",
    "tagging_scores",
    "word_accuracy",
]
