"""Precision@k against sets of relevant items, checked on an example worked by hand."""

from __future__ import annotations

import pytest

from mmptm.eval.precision import precision_at_k


def test_precision_at_3_by_hand() -> None:
    ranked = [
        ["a", "b", "c", "d"],  # relevant a, c, d: 2 of the first 3 → 2/3
        ["e", "f", "g"],  # relevant e, f, g, h: 3 of 3 → 1
        ["a", "b", "c"],  # relevant a, b: only 2 relevant < 3 → left out
        ["x"],  # relevant a, b, c: one result, a miss; out of 3 → 0
    ]
    relevant = [{"a", "c", "d"}, {"e", "f", "g", "h"}, {"a", "b"}, {"a", "b", "c"}]
    got = precision_at_k(ranked, relevant, k=3, n_items=10)
    assert got["per_query"] == [pytest.approx(2 / 3), 1.0, None, 0.0]
    assert got["precision"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert (got["k"], got["queries"], got["skipped"]) == (3, 3, 1)
    # a random ranking's expected share: relevant / items, over the counted queries
    assert got["chance"] == pytest.approx((3 / 10 + 4 / 10 + 3 / 10) / 3)
    # counting queries with fewer relevant items than k: the third scores 2/3
    loose = precision_at_k(ranked, relevant, k=3, min_relevant=1)
    assert loose["per_query"][2] == pytest.approx(2 / 3) and loose["skipped"] == 0
    assert "chance" not in loose


def test_precision_edge_cases() -> None:
    none = precision_at_k([["a"]], [{"a"}], k=3)
    assert none["precision"] is None and none["queries"] == 0 and none["skipped"] == 1
    assert precision_at_k([["a", "b"]], [{"a"}], k=1)["precision"] == 1.0
    with pytest.raises(ValueError, match="2 rankings but 1"):
        precision_at_k([["a"], ["b"]], [{"a"}])
    with pytest.raises(ValueError, match="k must be"):
        precision_at_k([["a"]], [{"a"}], k=0)
    with pytest.raises(ValueError, match="repeats"):
        precision_at_k([["a", "a", "b"]], [{"a", "b", "c"}], k=3)
