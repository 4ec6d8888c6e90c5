"""KnowBERT's candidate generator: every alias span with its entities' priors, by hand."""

from __future__ import annotations

import pytest

from mmptm.converters.candidates import CandidateGenerator, gold_index

ALIASES = {
    "T1": ["Bimo", "Bimo the Bear"],
    "T2": ["Bimo"],
    "P1": ["New York", "NY"],
    "P2": ["York"],
}


def test_every_alias_span_with_its_priors() -> None:
    gen = CandidateGenerator.build(ALIASES, degree={"T1": 3, "T2": 1})
    text = "Bimo the Bear met bimo in New York, not ny or NY."
    got = {(s, e): c for s, e, c in gen.spans(text)}
    # priors ∝ 1 + degree over the alias's entities: T1 4/6, T2 2/6
    assert got[(0, 4)] == [("T1", pytest.approx(4 / 6)), ("T2", pytest.approx(2 / 6))]
    assert got[(0, 13)] == [("T1", 1.0)]  # overlapping spans are all kept
    assert text[18:22] == "bimo" and got[(18, 22)] == got[(0, 4)]  # case-folded (4+ letters)
    assert got[(26, 34)] == [("P1", 1.0)] and got[(30, 34)] == [("P2", 1.0)]
    assert text[46:48] == "NY" and got[(46, 48)] == [("P1", 1.0)]
    assert (40, 42) not in got  # "ny": an acronym matches with its case only
    assert len(got) == 6


def test_priors_without_a_graph_k_and_words() -> None:
    gen = CandidateGenerator.build(ALIASES, k=1, max_words=2)
    spans = gen.spans("Bimo the Bear")
    # no degree: weights are numbers of aliases (T1 2, T2 1); k=1 keeps the best
    # (the prior stays p(e | alias) over all its entities: 2/3)
    assert spans == [(0, 4, [("T1", pytest.approx(2 / 3))])]  # 3 words: beyond max_words
    assert gold_index(spans[0], "T1") == 0 and gold_index(spans[0], "T2") == -1
    gen = CandidateGenerator.build(ALIASES, vocabulary=["T2"])
    assert gen.spans("Bimo") == [(0, 4, [("T2", 1.0)])]
    with pytest.raises(ValueError, match="max_words and k"):
        CandidateGenerator.build(ALIASES, k=0)
