"""NLVR2's consistency (its official metrics.py: sentence groups with the pair id blanked),
by hand."""

from __future__ import annotations

import pytest

from mmptm.data.shards import ShardWriter
from mmptm.eval.nlvr2 import consistency, identifiers, sentence_group


def test_sentence_group_blanks_the_pair_id():
    assert sentence_group("dev-850-0-0") == "dev-850--0"
    assert sentence_group("dev-850-3-0") == "dev-850--0"
    assert sentence_group("dev-850-3-1") == "dev-850--1"
    assert sentence_group("test-5") is None  # toyworld's: no sentence groups


def test_consistency_counts_sentences_whose_every_pair_is_right():
    judged = [
        ("dev-1-0-0", True), ("dev-1-1-0", True), ("dev-1-2-0", False),  # sentence 1-0: no
        ("dev-1-0-1", True), ("dev-1-3-1", True),  # sentence 1-1: yes
        ("dev-2-0-0", True),  # set 2, sentence 0 (not set 1's): yes
        ("dev-3-0-0", False),  # no
    ]  # fmt: skip
    assert consistency(judged) == pytest.approx(100.0 * 2 / 4)
    assert consistency([("dev-1-0-0", True)]) == 100.0
    assert consistency([]) is None
    assert consistency([("dev-1-0-0", True), ("train-7", True)]) is None


def test_identifiers_read_from_the_json(tmp_path):
    with ShardWriter(tmp_path / "test-%06d.tar", 10) as w:
        w.write({"__key__": "a", "json": {"identifier": "test1-4-1-0"}})
        w.write({"__key__": "b", "json": {"sentence": "no identifier"}})
    assert identifiers(str(tmp_path / "test-000000.tar")) == {"a": "test1-4-1-0", "b": "b"}
