"""Translation baselines that need no model: copy the source, and word by word.

A trained translator has to beat both on the same test pairs (issue 34's study):

- **copy the source**: the hypothesis is the source sentence itself. Between languages that
  share words, names and numbers it already scores some BLEU and more chrF;
- **word by word** (:class:`WordDictionary`): each source word replaced by its most probable
  translation under IBM Model 1 (Brown et al. 1993) trained by EM on the training pairs
  (a few iterations from uniform, with a NULL source word that absorbs target words no source
  word explains); a word the training pairs never had is copied. It knows the vocabulary
  but not word order, agreement or words that translate to several or none.

Words are ``\\w+`` runs (any script), matched lowercased; what lies between them (spaces,
punctuation) is copied from the source, so the output keeps the source's punctuation. A
translation is written in its most frequent form inside a sentence (German nouns keep their
capital), and with a capital first letter where the source word had one at the start of the
sentence.

Legend: M co-occurrence links (every source word, NULL included, of a pair times every
target word of it), K distinct (source word, target word) links, J target words in all.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from mmptm.eval.generation import translation_scores

__all__ = ["WordDictionary", "baseline_scores", "copy_source"]

_WORD = re.compile(r"\w+")
_NULL = 0  # the source word id of Model 1's NULL word


def copy_source(sources: Sequence[str]) -> list[str]:
    """The copy-the-source baseline: every hypothesis is its source sentence."""
    return list(sources)


class _Vocab:
    """Lowercased words to ids; ``first`` reserves ids below it (NULL)."""

    def __init__(self, first: int = 0) -> None:
        self.ids: dict[str, int] = {}
        self.words: list[str] = [""] * first

    def __call__(self, words: Iterable[str]) -> list[int]:
        out = []
        for w in words:
            if w not in self.ids:
                self.ids[w] = len(self.words)
                self.words.append(w)
            out.append(self.ids[w])
        return out


def _links(
    pairs: Sequence[tuple[list[int], list[int]]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Every (source word incl. NULL, target word) of every pair: source [M], target [M], the
    target word's position in the corpus [M] and the number J of target words."""
    empty = np.zeros(0, dtype=np.int64)  # np.concatenate needs one array
    src, tgt, pos = [empty], [empty], [empty]
    j = 0
    for s, t in pairs:
        s_ = np.array([_NULL, *s], dtype=np.int64)
        t_ = np.array(t, dtype=np.int64)
        src.append(np.tile(s_, len(t_)))  # [(|s|+1)*|t|], target-major
        tgt.append(np.repeat(t_, len(s_)))
        pos.append(np.repeat(np.arange(j, j + len(t_)), len(s_)))
        j += len(t_)
    return np.concatenate(src), np.concatenate(tgt), np.concatenate(pos), j


def _model1(
    pairs: Sequence[tuple[list[int], list[int]]], n_src: int, iterations: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
    """IBM Model 1 by EM: the links' source [K] and target [K] words, t(target | source) [K]
    and the log-likelihood of the target words before each iteration (never decreasing)."""
    src_M, tgt_M, pos_M, n_pos = _links(pairs)
    n_tgt = int(tgt_M.max()) + 1 if len(tgt_M) else 1
    keys_K, link_M = np.unique(src_M * n_tgt + tgt_M, return_inverse=True)
    src_K, tgt_K = keys_K // n_tgt, keys_K % n_tgt
    # uniform start: t(. | s) spread evenly over the target words s ever appears with
    t_K = 1.0 / np.bincount(src_K, minlength=n_src)[src_K]
    n_src_words = np.bincount(pos_M, minlength=n_pos)  # |s| + 1 for each target word [J]
    history = []
    for _ in range(iterations):
        p_M = t_K[link_M]
        z_J = np.bincount(pos_M, weights=p_M, minlength=n_pos)
        # P(target word) = sum_i t(t_j | s_i) / (|s| + 1): uniform alignment (Model 1)
        history.append(float(np.log(z_J / n_src_words).sum()))
        counts_K = np.bincount(link_M, weights=p_M / z_J[pos_M], minlength=len(keys_K))
        totals = np.bincount(src_K, weights=counts_K, minlength=n_src)
        t_K = counts_K / totals[src_K]
    return src_K, tgt_K, t_K, history


@dataclass
class WordDictionary:
    """A word-by-word translator learned from parallel pairs (the module docstring)."""

    #: lowercased source word -> its translation, as written inside a sentence
    table: dict[str, str]
    #: Model 1's log-likelihood of the training targets before each EM iteration
    log_likelihood: list[float] = field(default_factory=list)

    @classmethod
    def learn(cls, pairs: Iterable[tuple[str, str]], *, iterations: int = 10) -> WordDictionary:
        """Train on ``(source, target)`` sentences; ``iterations`` of EM (5-10 converge).

        EM holds every link (M, the module legend) in a few int64 / float64 arrays, about
        50 bytes a link: 100k pairs of 20 words are 42M links, 2 GB.
        """
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        src_vocab, tgt_vocab = _Vocab(first=1), _Vocab()
        forms: dict[str, Counter[str]] = defaultdict(Counter)
        ids: list[tuple[list[int], list[int]]] = []
        for source, target in pairs:
            words = _WORD.findall(target)
            for k, w in enumerate(words):
                # the sentence's first word is capitalised for its place, not its own sake
                forms[w.lower()][w] += 1 if k else 1e-3
            pair = src_vocab(w.lower() for w in _WORD.findall(source))
            ids.append((pair, tgt_vocab(w.lower() for w in words)))
        src_K, tgt_K, t_K, history = _model1(ids, len(src_vocab.words), iterations)
        # the best target of each source word: highest t, ties to the target word seen first
        best = np.lexsort((-t_K, src_K))
        first = np.ones(len(best), dtype=bool)
        first[1:] = src_K[best][1:] != src_K[best][:-1]
        table = {}
        for k in best[first]:
            if src_K[k] != _NULL:
                word = tgt_vocab.words[tgt_K[k]]
                table[src_vocab.words[src_K[k]]] = forms[word].most_common(1)[0][0]
        return cls(table, history)

    def translate(self, sentence: str) -> str:
        """The sentence with every known word replaced by its translation."""
        start = _WORD.search(sentence)

        def one(m: re.Match[str]) -> str:
            word = m.group()
            out = self.table.get(word.lower())
            if out is None:
                return word
            if start is not None and m.start() == start.start() and word[:1].isupper():
                return out[:1].upper() + out[1:]
            return out

        return _WORD.sub(one, sentence)

    def translate_all(self, sentences: Sequence[str]) -> list[str]:
        """:meth:`translate` for each sentence."""
        return [self.translate(s) for s in sentences]


def baseline_scores(
    train_pairs: Sequence[tuple[str, str]],
    test_pairs: Sequence[tuple[str, str]],
    lang: str,
    *,
    iterations: int = 10,
) -> dict[str, dict[str, float]]:
    """BLEU and chrF of both baselines on ``test_pairs`` (target language ``lang``)."""
    if not test_pairs:
        raise ValueError("no test pairs to score")
    sources = [s for s, _ in test_pairs]
    refs = [[t] for _, t in test_pairs]
    dictionary = WordDictionary.learn(train_pairs, iterations=iterations)
    return {
        "copy": translation_scores(copy_source(sources), refs, lang),
        "dictionary": translation_scores(dictionary.translate_all(sources), refs, lang),
    }
