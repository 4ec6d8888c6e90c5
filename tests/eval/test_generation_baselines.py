"""Translation baselines: copy-the-source, and the word-by-word dictionary (IBM Model 1) that
must find a hand-made corpus's dictionary."""

from __future__ import annotations

import itertools

import pytest

from mmptm.eval import translation_baselines as TB
from mmptm.eval.generation import translation_scores

# English -> German: every content word appears with its translation in several sentences
# and with different neighbours, so only its translation co-occurs with it every time
TRAIN = [
    ("the red circle", "der rote Kreis"),
    ("the blue circle", "der blaue Kreis"),
    ("the red square", "das rote Quadrat"),
    ("the blue square", "das blaue Quadrat"),
    ("a red star", "ein roter Stern"),
    ("a blue star", "ein blauer Stern"),
    ("the circle is red", "der Kreis ist rot"),
    ("the square is blue", "das Quadrat ist blau"),
    ("the star is big", "der Stern ist groß"),
    ("a big circle", "ein großer Kreis"),
    ("the circle is big", "der Kreis ist groß"),
    ("the square is big", "das Quadrat ist groß"),
    ("a red square", "ein rotes Quadrat"),
    ("a big square", "ein großes Quadrat"),
]
# adjectives: their most frequent inflection (rote 2x of rot/rote/roter/rotes, blaue 2x)
EXPECTED = {
    "the": "der", "a": "ein", "is": "ist", "circle": "Kreis", "square": "Quadrat",
    "star": "Stern", "red": "rote", "blue": "blaue", "big": "groß",
}  # fmt: skip


def test_copy_source() -> None:
    assert TB.copy_source(["a b", "c"]) == ["a b", "c"]


def test_model1_finds_the_dictionary() -> None:
    d = TB.WordDictionary.learn(TRAIN, iterations=20)
    assert d.table == EXPECTED
    # EM never lowers the likelihood, and it learns something
    ll = d.log_likelihood
    assert (
        len(ll) == 20 and all(b >= a - 1e-9 for a, b in itertools.pairwise(ll)) and ll[-1] > ll[0]
    )


def test_translate_word_by_word() -> None:
    d = TB.WordDictionary({"the": "der", "circle": "Kreis", "is": "ist", "big": "groß"})
    # unknown words are copied, punctuation and spacing kept, the first word capitalised
    assert d.translate("The circle is green, big!") == "Der Kreis ist green, groß!"
    assert d.translate("  the   circle") == "  der   Kreis"
    assert d.translate("Circle the Circle") == "Kreis der Kreis"  # mid-sentence: its own case
    assert d.translate("") == "" and d.translate("...") == "..."
    learned = TB.WordDictionary.learn(TRAIN, iterations=20)
    assert learned.translate("The square is big.").split()[:3] == ["Der", "Quadrat", "ist"]


def test_non_latin_scripts() -> None:
    pairs = [
        ("red square", "красный квадрат"),
        ("blue square", "синий квадрат"),
        ("red circle", "красный круг"),
        ("blue circle", "синий круг"),
    ]
    d = TB.WordDictionary.learn(pairs, iterations=20)
    assert d.table == {
        "red": "красный", "square": "квадрат", "blue": "синий", "circle": "круг"
    }  # fmt: skip
    assert d.translate("Blue circle") == "Синий круг"


def test_baseline_scores() -> None:
    test = [
        ("the blue circle is big", "der blaue Kreis ist groß"),
        ("a red square", "ein rotes Quadrat"),
    ]
    got = TB.baseline_scores(TRAIN, test, "de", iterations=20)
    assert set(got) == {"copy", "dictionary"}
    refs = [[t] for _, t in test]
    assert got["copy"] == translation_scores([s for s, _ in test], refs, "de")
    assert got["dictionary"]["bleu"] > got["copy"]["bleu"]
    assert got["dictionary"]["chrf"] > got["copy"]["chrf"]
    with pytest.raises(ValueError, match="no test pairs"):
        TB.baseline_scores(TRAIN, [], "de")
    with pytest.raises(ValueError, match="iterations"):
        TB.WordDictionary.learn(TRAIN, iterations=0)
