"""SQuAD v1.1's EM and F1, by hand from the official script's rules."""

from __future__ import annotations

import pytest

from mmptm.eval.qa import exact_match, normalize_answer, squad_scores, token_f1


def test_normalisation():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theater") == "theater"  # articles only as whole words
    assert normalize_answer("A-B") == "ab"  # punctuation removed before the articles
    # ASCII punctuation only, as the script's string.punctuation
    assert normalize_answer("«Paris»。") == "«paris»。"


def test_f1_and_em_by_hand():
    # "cat sat" vs "cat sat down": 2 shared, p = 1, r = 2/3
    assert token_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)
    # repeated tokens count as a multiset: one shared "cat", p = 1/3, r = 1
    assert token_f1("cat cat cat", "cat") == pytest.approx(0.5)
    assert token_f1("", "cat") == 0.0 and token_f1("", "") == 0.0  # no shared token: 0
    assert exact_match("", "") == 1.0 and exact_match("The Broncos.", "broncos") == 1.0
    assert exact_match("Denver", "Denver Broncos") == 0.0


def test_scores_take_the_best_gold_and_count_unanswered_questions():
    golds = {"q1": ["Denver Broncos", "The Denver Broncos"], "q2": ["Santa Clara, California"],
             "q3": ["1990"]}  # fmt: skip
    preds = {"q1": "the denver broncos", "q2": "Santa Clara"}
    s = squad_scores(preds, golds)
    # q1: EM 1, F1 1; q2: EM 0, F1: 2 shared of 2 predicted and 3 gold = 0.8; q3: none: 0
    assert s == {"n": 3, "em": pytest.approx(1 / 3), "f1": pytest.approx(1.8 / 3),
                 "unanswered": 1}  # fmt: skip
