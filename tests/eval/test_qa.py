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


# MLQA's mlqa_evaluation_v1.py, each case worked out by hand from the script's rules


def test_mlqa_normalisation_per_language():
    from mmptm.eval.qa import mlqa_normalize

    # en: SQuAD's articles; Unicode punctuation goes too (SQuAD's script keeps it)
    assert mlqa_normalize("The «Quick» fox。", "en") == "quick fox"
    assert mlqa_normalize("Theater", "en") == "theater"
    # es: its eight articles as words; "¿" and "¡" are punctuation (Po)
    assert mlqa_normalize("¡Los Ángeles y la Unión!", "es") == "ángeles y unión"
    assert mlqa_normalize("Unos, unas, una; un: el.", "es") == ""
    assert mlqa_normalize("Elena", "es") == "elena"
    # de: der/die/das/des/dem/den and the forms of ein; "Dieser" is no article
    assert mlqa_normalize("Die Katze des Nachbarn, einem Freund", "de") == "katze nachbarn freund"
    assert mlqa_normalize("Dieser „Hund“", "de") == "dieser hund"
    # vi: của, là, cái, chiếc, những as words
    assert mlqa_normalize("Những chiếc xe của tôi", "vi") == "xe tôi"
    # ar: every "ال", inside a word too, becomes a space
    assert mlqa_normalize("الكتاب جميل، جدا", "ar") == "كتاب جميل جدا"
    assert mlqa_normalize("سالم", "ar") == "س م"
    # hi: no articles; the danda (।) is punctuation
    assert mlqa_normalize("भारत  की राजधानी।", "hi") == "भारत की राजधानी"
    # zh: every ideograph a token, Latin runs split at spaces, full-width punctuation removed
    assert mlqa_normalize("北京大学，Peking  University。", "zh") == "北 京 大 学 peking university"
    assert mlqa_normalize("2008年奥运会", "zh") == "2008 年 奥 运 会"
    with pytest.raises(ValueError, match="no language 'fr'"):
        mlqa_normalize("le chat", "fr")


def test_mlqa_scores_by_hand():
    golds = {"de": ["der Rhein"], "zh": ["北京大学"], "ar": ["القاهرة"], "en": ["the cat"]}
    preds = {"de": "Rhein", "zh": "北京", "ar": "في القاهرة", "en": "a cat"}
    langs = {"de": "de", "zh": "zh", "ar": "ar", "en": "en"}
    s = squad_scores(preds, golds, langs)
    # de: "rhein" = "rhein": EM 1. zh: 2 of 2 predicted, 2 of 4 gold: F1 2/3, EM 0.
    # ar: "في قاهرة" vs "قاهرة": p 1/2, r 1: F1 2/3. en: "cat" = "cat": EM 1.
    assert s["em"] == pytest.approx(2 / 4)
    assert s["f1"] == pytest.approx((1 + 2 / 3 + 2 / 3 + 1) / 4)
    # SQuAD's rules differ: de "rhein" vs "der rhein" F1 2/3; zh one token each, none shared;
    # ar "في القاهرة" vs "القاهرة" 2/3; en as above
    plain = squad_scores(preds, golds)
    assert plain["em"] == pytest.approx(1 / 4)
    assert plain["f1"] == pytest.approx((2 / 3 + 0 + 2 / 3 + 1) / 4)
