"""Caption and translation metrics over strings: BLEU and chrF (sacrebleu), CIDEr-D (ours).

Every metric is corpus-level and takes ``hyps`` (one string per item) and ``refs`` (a list
of reference strings per item; items may have different numbers of references, e.g. COCO's
five to seven captions an image).

**Translation** (:func:`translation_scores`): sacrebleu's BLEU and chrF on the strings as
they are, BLEU with the tokenizer sacrebleu's own defaults pick for the target language
(:func:`bleu_tokenizer`): ``zh`` for Chinese; ``char`` for Japanese, Thai, Lao, Khmer and
Burmese (sacrebleu's default for Japanese is ``ja-mecab``, which needs MeCab, and
``flores200`` needs a downloaded sentencepiece model: ``char`` needs nothing and gives the
same number on every machine); ``13a`` for everything else, toyworld's five languages
(en, de, fr, es and Cyrillic ru, all written with spaces between words) included.

**Captioning** (:func:`caption_scores`): the three metrics read the captions after
:func:`caption_tokens`, the one caption tokenizer, as coco-caption reads them after its PTB
tokenizer: NFKC-normalised, lowercased, every Unicode punctuation character (category P*)
turned into a space, each Han / Hiragana / Katakana character a word of its own (those
scripts put no spaces between words), split on whitespace. Unlike PTB it makes two words of
"man's" ("man s", PTB: "man 's") and of "3.5" ("3 5").

**CIDEr-D** (:func:`cider_d_items`) is coco-caption's ``Cider`` (Vedantam et al. 2015 with
the -D changes), reimplemented with numpy and checked against pycocoevalcap to 1e-9: n-grams
of 1 to 4 words weighted by tf-idf, the document frequency counted over the references of
the evaluated set (an n-gram once per item), idf = log(N) - log(max(1, df)); per n, the
cosine between the hypothesis vector and each reference vector with the hypothesis counts
clipped at the reference's (``min(h, r) * r``), times a Gaussian penalty exp(-d² / 2σ²),
σ = 6, on the difference d in words; the mean over n, over references, times 10.
(coco-caption counts bigrams for the length, words - 1 for a non-empty caption: the same d,
and against an empty caption the cosine is 0 anyway.) Papers print CIDEr-D x 100 ("CIDEr
117.0"), which is what :func:`caption_scores` reports; :func:`cider_d` returns
coco-caption's value.

Legend: N items, R references of an item, V n-grams of an item, G n-gram orders.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Sequence

import numpy as np
import regex
from sacrebleu.metrics import BLEU, CHRF

__all__ = [
    "bleu",
    "bleu_tokenizer",
    "caption_scores",
    "caption_tokens",
    "chrf",
    "cider_d",
    "cider_d_items",
    "translation_scores",
]

_PUNCTUATION = regex.compile(r"\p{P}+")
_CHARACTER_WORDS = regex.compile(r"([\p{Han}\p{Hiragana}\p{Katakana}])")
# sacrebleu's per-language defaults, except that MeCab (ja) is replaced by characters
_BLEU_TOKENIZERS = {"zh": "zh", **dict.fromkeys(("ja", "th", "lo", "km", "my"), "char")}
_CIDER_ORDER = 4
_CIDER_SIGMA = 6.0


def caption_tokens(text: str) -> list[str]:
    """The words of a caption as every caption metric reads them (the module docstring)."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = _PUNCTUATION.sub(" ", text)
    return _CHARACTER_WORDS.sub(r" \1 ", text).split()


def bleu_tokenizer(lang: str) -> str:
    """sacrebleu's tokenizer for BLEU on text in language ``lang`` ("zh", "de", "pt-BR"...)."""
    return _BLEU_TOKENIZERS.get(regex.split(r"[-_]", lang.lower(), maxsplit=1)[0], "13a")


def _check(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    """ValueError unless there is one hypothesis per item and every item has references."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but references for {len(refs)} items")
    if not hyps:
        raise ValueError("no hypotheses to score")
    for i, (hyp, item_refs) in enumerate(zip(hyps, refs)):
        if not isinstance(hyp, str):
            raise ValueError(f"hypothesis {i} is {type(hyp).__name__}, not a string")
        if isinstance(item_refs, str) or not item_refs:
            raise ValueError(f"item {i}: references must be a non-empty list of strings")
        if not all(isinstance(r, str) for r in item_refs):
            raise ValueError(f"item {i}: a reference is not a string")


def _ref_streams(refs: Sequence[Sequence[str]]) -> list[list[str | None]]:
    """Per-item references as sacrebleu's reference streams (stream k = every item's k-th).

    An item with fewer references than the most has None in the streams past its last:
    sacrebleu drops None (an empty string would count as a reference of length 0).
    """
    width = max(len(r) for r in refs)
    return [[r[k] if k < len(r) else None for r in refs] for k in range(width)]


def bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]], *, tokenize: str = "13a") -> float:
    """Corpus BLEU-4 (0-100) through sacrebleu, with its default exponential smoothing."""
    _check(hyps, refs)
    return BLEU(tokenize=tokenize).corpus_score(list(hyps), _ref_streams(refs)).score


def chrf(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    *,
    char_order: int = 6,
    word_order: int = 0,
) -> float:
    """Corpus chrF (0-100) through sacrebleu; ``word_order=2`` gives chrF++."""
    _check(hyps, refs)
    metric = CHRF(char_order=char_order, word_order=word_order)
    return metric.corpus_score(list(hyps), _ref_streams(refs)).score


# ---------------------------------------------------------------------------------------------
# CIDEr-D


def _ngram_counts(words: Sequence[str], order: int) -> Counter[tuple[str, ...]]:
    return Counter(
        tuple(words[i : i + k]) for k in range(1, order + 1) for i in range(len(words) - k + 1)
    )


def _cider_item(
    hyp: Counter[tuple[str, ...]],
    refs: list[Counter[tuple[str, ...]]],
    df: Counter[tuple[str, ...]],
    log_n: float,
    order: int,
    sigma: float,
) -> float:
    """One item's CIDEr-D from its n-gram counts and the set's document frequencies."""
    grams = list(set(hyp).union(*refs))
    counts_SV = np.array([[c[g] for g in grams] for c in (hyp, *refs)], dtype=np.float64)
    counts_SV = counts_SV.reshape(1 + len(refs), len(grams))  # S = the hypothesis + R refs
    # an n-gram no reference of the set holds (df 0) weighs as one held once: log(max(1, df))
    idf_V = log_n - np.log(np.maximum(1.0, np.array([df[g] for g in grams], dtype=np.float64)))
    of_order_VG = np.array([len(g) for g in grams])[:, None] == np.arange(1, order + 1)
    vec_SV = counts_SV * idf_V
    norm_SG = np.sqrt((vec_SV**2) @ of_order_VG)
    hyp_V, refs_RV = vec_SV[0], vec_SV[1:]
    overlap_RG = (np.minimum(hyp_V, refs_RV) * refs_RV) @ of_order_VG  # clipped at the ref
    denom_RG = norm_SG[0] * norm_SG[1:]
    cos_RG = np.divide(overlap_RG, denom_RG, out=np.zeros_like(overlap_RG), where=denom_RG > 0)
    length_S = (counts_SV @ of_order_VG)[:, 0]  # words
    delta_R = length_S[0] - length_S[1:]
    penalty_R = np.exp(-(delta_R**2) / (2 * sigma**2))
    return float(10.0 * (cos_RG * penalty_R[:, None]).mean(axis=1).sum() / len(refs))


def cider_d_items(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    *,
    order: int = _CIDER_ORDER,
    sigma: float = _CIDER_SIGMA,
) -> np.ndarray:
    """Each item's CIDEr-D [N] (coco-caption's scale), idf over this set's references."""
    _check(hyps, refs)
    hyp_counts = [_ngram_counts(caption_tokens(h), order) for h in hyps]
    ref_counts = [[_ngram_counts(caption_tokens(r), order) for r in rs] for rs in refs]
    df: Counter[tuple[str, ...]] = Counter()
    for item in ref_counts:
        df.update(set().union(*item))
    log_n = float(np.log(float(len(refs))))
    scores = [_cider_item(h, rs, df, log_n, order, sigma) for h, rs in zip(hyp_counts, ref_counts)]
    return np.array(scores, dtype=np.float64)


def cider_d(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """Corpus CIDEr-D: the mean of :func:`cider_d_items` (coco-caption's value, not x 100)."""
    return float(cider_d_items(hyps, refs).mean())


# ---------------------------------------------------------------------------------------------
# The scores `mmptm eval` prints


def caption_scores(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> dict[str, float]:
    """BLEU-4, chrF and CIDEr-D (x 100) of captions, all on :func:`caption_tokens`' words."""
    _check(hyps, refs)
    flat_hyps = [" ".join(caption_tokens(h)) for h in hyps]
    flat_refs = [[" ".join(caption_tokens(r)) for r in rs] for rs in refs]
    return {
        "n": float(len(hyps)),
        "bleu4": bleu(flat_hyps, flat_refs, tokenize="none"),
        "chrf": chrf(flat_hyps, flat_refs),
        "cider_d": 100.0 * cider_d(flat_hyps, flat_refs),
    }


def translation_scores(
    hyps: Sequence[str], refs: Sequence[Sequence[str]], lang: str
) -> dict[str, float]:
    """BLEU (tokenized for target language ``lang``, :func:`bleu_tokenizer`) and chrF."""
    return {
        "n": float(len(hyps)),
        "bleu": bleu(hyps, refs, tokenize=bleu_tokenizer(lang)),
        "chrf": chrf(hyps, refs),
    }
