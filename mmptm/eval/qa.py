"""Evaluation of extractive QA (``extractive_qa``): SQuAD v1.1's exact match and F1.

The metric is the official ``evaluate-v1.1.py``'s, which XTREME uses for XQuAD and
TyDiQA-GoldP: an answer is normalised (lower case, ASCII punctuation removed, the articles
"a", "an", "the" removed as words, whitespace collapsed); EM = the normalised prediction
equals a normalised gold answer, F1 = the best over gold answers of the bag-of-tokens F1 of
the normalised strings split at whitespace; both averaged over every question, a question
without a prediction scoring 0.

MLQA's own script (``mlqa_evaluation_v1.py``; the head's ``metric: mlqa``) normalises by the
answer's language, each question's ``json.language`` (the context's language): lower case;
every Unicode punctuation character (category P*) and ASCII punctuation removed; the
language's articles removed as words (en a/an/the; es un/una/unos/unas/el/la/los/las; de
ein/eine/einen/einem/eines/einer/der/die/das/den/dem/des; vi của/là/cái/chiếc/những; ar every
"ال", inside words too, as the script's pattern does; hi and zh none); then tokens at
whitespace, in zh each CJK ideograph (U+4E00-U+9FA5) a token of its own; EM and F1 as
SQuAD's over those tokens. The script knows en, es, de, vi, ar, hi and zh only.

A question's prediction: :meth:`~mmptm.objectives.qa.ExtractiveQA.best_spans` of each of
its windows, the best-scoring one kept, mapped back to characters through the tokenizer's
piece offsets in the context and cut from the context as written.
"""

from __future__ import annotations

import json
import re
import string
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from functools import cache, partial
from typing import Any

import torch

from mmptm.batch import END, KEY, move_to
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.encoders.base import VocabInfo
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.qa import ExtractiveQA

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


#: MLQA's articles per language (``mlqa_evaluation_v1.py``); None: the language has none
_MLQA_ARTICLES = {
    "en": re.compile(r"\b(a|an|the)\b"),
    "es": re.compile(r"\b(un|una|unos|unas|el|la|los|las)\b"),
    "de": re.compile(r"\b(ein|eine|einen|einem|eines|einer|der|die|das|den|dem|des)\b"),
    "vi": re.compile(r"\b(của|là|cái|chiếc|những)\b"),
    "ar": re.compile("ال"),  # the script's '\\sال^|ال': its first branch never matches
    "hi": None,
    "zh": None,
}
#: the languages MLQA's script segments as Chinese (each ideograph a token)
_MIXED_SEGMENTATION = {"zh"}
_CJK = re.compile("[\u4e00-\u9fa5]")


@cache
def _unicode_punctuation() -> frozenset[str]:
    """MLQA's PUNCT: every character of a Unicode punctuation category, and ASCII's."""
    chars = (chr(i) for i in range(sys.maxunicode))
    return frozenset(c for c in chars if unicodedata.category(c).startswith("P")) | _PUNCTUATION


def _mixed_segmentation(text: str, punctuation: frozenset[str]) -> list[str]:
    """MLQA's zh tokens: an ideograph or punctuation mark alone, other runs split at spaces."""
    tokens: list[str] = []
    run = ""
    for ch in text:
        if _CJK.match(ch) or ch in punctuation:
            tokens += run.split()
            run = ""
            tokens.append(ch)
        else:
            run += ch
    return tokens + run.split()


def mlqa_normalize(s: str, lang: str) -> str:
    """MLQA's normalisation of an answer in ``lang`` (module doc); its tokens joined by spaces."""
    if lang not in _MLQA_ARTICLES:
        raise ValueError(
            f"MLQA's evaluation knows no language {lang!r}: one of "
            f"{', '.join(sorted(_MLQA_ARTICLES))}"
        )
    punctuation = _unicode_punctuation()
    s = "".join(ch for ch in s.lower() if ch not in punctuation)
    articles = _MLQA_ARTICLES[lang]
    if articles is not None:
        s = articles.sub(" ", s)
    tokens = _mixed_segmentation(s, punctuation) if lang in _MIXED_SEGMENTATION else s.split()
    return " ".join(t for t in tokens if t.strip())


def exact_match(
    prediction: str, gold: str, normalize: Callable[[str], str] = normalize_answer
) -> float:
    return float(normalize(prediction) == normalize(gold))


def token_f1(
    prediction: str, gold: str, normalize: Callable[[str], str] = normalize_answer
) -> float:
    """F1 of the normalised strings' whitespace tokens (as multisets)."""
    pred, want = normalize(prediction).split(), normalize(gold).split()
    same = sum((Counter(pred) & Counter(want)).values())
    if same == 0:
        return 0.0
    p, r = same / len(pred), same / len(want)
    return 2 * p * r / (p + r)


def squad_scores(
    predictions: Mapping[str, str],
    golds: Mapping[str, Iterable[str]],
    languages: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``em`` and ``f1`` (fractions, not percentages) over every question of ``golds``, each
    the best over its gold answers; ``n`` questions, ``unanswered``: without a prediction.
    With ``languages`` (question → its answers' language) MLQA's normalisation replaces
    SQuAD's."""
    em = f1 = 0.0
    missing = 0
    for qid, answers in golds.items():
        answers = list(answers)
        if qid not in predictions:
            missing += 1
            continue
        pred = predictions[qid]
        norm = (
            normalize_answer if languages is None else partial(mlqa_normalize, lang=languages[qid])
        )
        em += max((exact_match(pred, a, norm) for a in answers), default=0.0)
        f1 += max((token_f1(pred, a, norm) for a in answers), default=0.0)
    n = len(golds)
    return {"n": n, "em": em / n if n else 0.0, "f1": f1 / n if n else 0.0, "unanswered": missing}


def qa_head(model: PretrainModel) -> ExtractiveQA | None:
    """The model's extractive QA head, or None."""
    return next((o for o in model.objectives.values() if isinstance(o, ExtractiveQA)), None)


def read_questions(shards: str) -> dict[str, dict[str, Any]]:
    """Per sample key: its ``context`` (the pair's second text) and gold ``answers`` texts."""
    out: dict[str, dict[str, Any]] = {}
    for s in tar_samples(expand_shards(shards), SkipCounter()):
        try:
            meta = json.loads(s.get("json", b"{}"))
            answers = [str(a["text"]) for a in meta.get("answers") or []]
            out[s[KEY]] = {"context": str(meta["hypothesis"]), "answers": answers,
                           "id": str(meta.get("id", s[KEY])),
                           "language": str(meta.get("language", ""))}  # fmt: skip
        except (ValueError, KeyError, TypeError):
            continue  # not a QA sample: the stream skips or rejects it too
    return out


@torch.no_grad()
def predict_spans(
    model: PretrainModel, cfg: Any, tokenizer: Any, shards: str, device: str = "cpu"
) -> dict[str, tuple[float, int, int]]:
    """Per sample key: the best (score, first piece, last piece) over its windows."""
    head = qa_head(model)
    if head is None:
        raise ValueError("the run has no extractive_qa head: fine-tune one first")
    model.eval().to(device)
    # the head's windows alone: another head's data side (MLM's masking) must not run here
    windows = head.data_transform(head.cfg, VocabInfo.from_tokenizer(tokenizer))
    stream = stream_config(cfg.data, tokenizer, split="test", shards=shards,
                           needs=model.data_needs(), transforms=[windows],
                           seed=cfg.seed)  # fmt: skip
    best: dict[str, tuple[float, int, int]] = {}
    for batch in single_pass(stream):
        if END in batch:
            continue
        keys = list(batch[KEY])
        batch = move_to(batch, device)
        start_RL, end_RL = head.logits(model.fuse(batch), batch)
        scores, firsts, lasts = (t.tolist() for t in head.best_spans(start_RL, end_RL, batch))
        for key, score, a, b in zip(keys, scores, firsts, lasts):
            if key not in best or score > best[key][0]:
                best[key] = (score, a, b)
    return best


def evaluate_qa_set(
    model: PretrainModel, cfg: Any, tokenizer: Any, shards: str, device: str = "cpu"
) -> dict[str, Any]:
    """SQuAD's EM and F1 of the model's QA head on ``shards`` (``n`` questions), or MLQA's
    when the head's ``metric`` is ``mlqa`` (module doc)."""
    questions = read_questions(shards)
    if not questions:
        raise ValueError(f"{shards}: no QA samples (json premise / hypothesis / answers)")
    languages = _mlqa_languages(questions, shards) if _metric(model) == "mlqa" else None
    best = predict_spans(model, cfg, tokenizer, shards, device)
    predictions = {}
    for key, (score, first, last) in best.items():
        if key not in questions or score == float("-inf"):
            continue
        context = questions[key]["context"]
        _, offsets = tokenizer.encode_with_offsets(context)
        predictions[key] = context[offsets[first][0] : offsets[last][1]]
    golds = {k: q["answers"] for k, q in questions.items()}
    return squad_scores(predictions, golds, languages)


def _metric(model: PretrainModel) -> str:
    """The QA head's ``metric`` (squad unless a recipe says mlqa)."""
    return getattr(getattr(qa_head(model), "cfg", None), "metric", "squad")


def _mlqa_languages(questions: Mapping[str, Mapping[str, Any]], shards: str) -> dict[str, str]:
    """Question key → its answers' language (``json.language``), each one MLQA's script knows."""
    out = {}
    for key, q in questions.items():
        lang = q["language"]
        if lang not in _MLQA_ARTICLES:
            raise ValueError(
                f"{shards}: sample {key!r} has language {lang!r}; metric mlqa needs one of "
                f"{', '.join(sorted(_MLQA_ARTICLES))} (mmptm data squad --lang: the context's)"
            )
        out[key] = lang
    return out


__all__ = [
    "evaluate_qa_set",
    "exact_match",
    "mlqa_normalize",
    "normalize_answer",
    "predict_spans",
    "qa_head",
    "read_questions",
    "squad_scores",
    "token_f1",
]
