"""Token tagging metrics: chunks and span F1 against seqeval (the oracle), accuracy, and words
without a prediction."""

from __future__ import annotations

import random

import pytest
from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score
from seqeval.metrics.sequence_labeling import get_entities

from mmptm.eval.tagging import chunks, span_scores, tagging_scores, word_accuracy

# (gold, predicted) sentence lists, malformed BIO included
CASES = [
    # seqeval's own example: one chunk right of two
    ([["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]],
     [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]),
    # I- without B- starts a chunk; a type change inside a chunk splits it
    ([["I-PER", "I-PER", "O", "B-LOC", "I-ORG"]],
     [["B-PER", "I-PER", "O", "I-LOC", "I-ORG"]]),
    # a chunk at a sentence's end does not run into the next sentence's I-
    ([["O", "B-ORG"], ["I-ORG", "O"]], [["O", "B-ORG"], ["I-ORG", "I-ORG"]]),
    # B B: two chunks; nothing predicted; nothing gold
    ([["B-LOC", "B-LOC", "O"]], [["O", "O", "O"]]),
    ([["O", "O"]], [["B-PER", "O"]]),
    ([["O"]], [["O"]]),
    # IOBES read by the same rules
    ([["S-PER", "B-LOC", "E-LOC", "O"]], [["S-PER", "B-LOC", "I-LOC", "E-LOC"]]),
]  # fmt: skip


@pytest.mark.filterwarnings("ignore")  # seqeval warns of undefined precision / recall
@pytest.mark.parametrize("gold, pred", CASES)
def test_span_scores_equal_seqeval(gold, pred):
    s = span_scores(gold, pred)
    assert s["p"] == pytest.approx(precision_score(gold, pred))
    assert s["r"] == pytest.approx(recall_score(gold, pred))
    assert s["f1"] == pytest.approx(f1_score(gold, pred))
    assert sorted(chunks(gold)) == sorted(get_entities(gold))
    assert word_accuracy(gold, pred) == pytest.approx(accuracy_score(gold, pred))


def test_chunks_of_malformed_bio_by_hand():
    # joined: I-PER I-PER O B-LOC I-ORG O(sep) ; I- opens, B-LOC closes at the type change
    assert chunks([["I-PER", "I-PER", "O", "B-LOC", "I-ORG"]]) == [
        ("PER", 0, 1), ("LOC", 3, 3), ("ORG", 4, 4)]  # fmt: skip
    # the sentence separator ends the first sentence's chunk at index 1
    assert chunks([["O", "B-ORG"], ["I-ORG"]]) == [("ORG", 1, 1), ("ORG", 3, 3)]


@pytest.mark.filterwarnings("ignore")
def test_random_sequences_equal_seqeval():
    rng = random.Random(0)
    tags = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG", "E-PER", "S-LOC"]
    for _ in range(300):
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 7))] for _ in range(3)]
        pred = [[rng.choice(tags) for _ in s] for s in gold]
        s = span_scores(gold, pred)
        assert s["f1"] == pytest.approx(f1_score(gold, pred)), (gold, pred)
        assert s["p"] == pytest.approx(precision_score(gold, pred))
        assert sorted(chunks(pred)) == sorted(get_entities(pred))


def test_words_without_a_prediction():
    gold = [["B-PER", "I-PER", "O"], ["NOUN", "VERB"]]
    # the second word cut off: "O" for chunks (the chunk is then B-PER alone: wrong)
    s = tagging_scores(gold[:1], [["B-PER", None, "O"]], "bio")
    assert s["f1"] == 0.0 and s["acc"] == pytest.approx(2 / 3)
    s = tagging_scores(gold[1:], [[None, "VERB"]], "tags")
    assert s == {"acc": 0.5}
    with pytest.raises(ValueError, match="differ"):
        span_scores(gold, gold[:1])
