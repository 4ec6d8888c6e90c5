"""benchmarks/knowledge_probes.py lookmates: kvqa answers counted as the asked toy's own value,
a look-mate's value, or neither, against a hand-made world."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import ROOT

from mmptm.data.shards import ShardWriter

sys.path.insert(0, str(ROOT / "benchmarks"))


def _world(tmp_path):
    # Two looks: toys a, b share (circle, red, small); c alone is (square, blue, large).
    graph = tmp_path / "world" / "knowledge" / "graph"
    graph.mkdir(parents=True)
    red, blue = ("circle", "red", "small"), ("square", "blue", "large")
    toys = [
        {"id": "a", "shape": red[0], "color": red[1], "size": red[2], "facts": {"made_of": "m1"}},
        {"id": "b", "shape": red[0], "color": red[1], "size": red[2], "facts": {"made_of": "m2"}},
        {"id": "c", "shape": blue[0], "color": blue[1], "size": blue[2],
         "facts": {"made_of": "m3"}},
    ]  # fmt: skip
    values = [
        {"id": f"m{i}", "relation": "made_of", "names": {"en": n}}
        for i, n in ((1, "Wood"), (2, "Metal"), (3, "Glass"), (4, "Stone"))
    ]
    (graph / "toys.json").write_text(json.dumps(toys))
    (graph / "values.json").write_text(json.dumps(values))
    questions = [("q1", "a", "text"), ("q2", "b", "text"), ("q3", "c", "graph")]
    with ShardWriter(tmp_path / "world" / "knowledge" / "kvqa" / "test-%06d.tar", 10) as w:
        for qid, toy, facts in questions:
            meta = {"question_id": qid, "entity": toy, "relation": "made_of", "facts": facts}
            w.write({"__key__": qid, "json": meta})
    run = tmp_path / "ft"
    run.mkdir()
    answers = [  # a: its look-mate b's value; b: its own; c: another toy's
        {"question_id": "q1", "answer": "metal"},
        {"question_id": "q2", "answer": "metal"},
        {"question_id": "q3", "answer": "wood"},
    ]
    (run / "test_results.json").write_text(json.dumps(answers))
    return run, tmp_path / "world"


def test_lookmates_counts_own_and_look_mate_answers(tmp_path):
    knowledge_probes = pytest.importorskip("knowledge_probes")
    run, world = _world(tmp_path)
    got = knowledge_probes.lookmates(str(run), world, tmp_path / "out")
    # text: q1 is a look-mate's value, q2 its own; each toy of the red look has 1 mate of 4 values
    assert got["text"] == {"queries": 2, "own": 50.0, "look-mate": 50.0,
                           "uniform own": 25.0, "uniform look-mate": 25.0}  # fmt: skip
    # graph: c has no look-mate; "wood" is neither its own value nor a mate's
    assert got["graph"] == {"queries": 1, "own": 0.0, "look-mate": 0.0,
                            "uniform own": 25.0, "uniform look-mate": 0.0}  # fmt: skip


def test_swap_shares_count_the_pictured_and_the_swapped_in_value():
    knowledge_probes = pytest.importorskip("knowledge_probes")
    toys = {
        "a": {"split": "test", "facts": {"made_of": "m1"}},
        "b": {"split": "train", "facts": {"made_of": "m2"}},
        "c": {"split": "dev", "facts": {"made_of": "m3"}},
    }
    name = {"m1": "wood", "m2": "metal", "m3": "glass"}
    swap = {"a": "b", "b": "c", "c": "a"}
    metas = [  # q1, q2 ask about a (swapped-in b, a training toy); q3 about b (swapped-in c)
        {"question_id": 1, "entity": "a", "relation": "made_of", "facts": "text"},
        {"question_id": 2, "entity": "a", "relation": "made_of", "facts": "text"},
        {"question_id": 3, "entity": "b", "relation": "made_of", "facts": "graph"},
    ]
    answers = {1: "metal", 2: "wood", 3: "stone"}  # b's value, a's own, neither
    got = knowledge_probes.swap_shares(metas, answers, toys, name, swap)
    assert got == {
        "text, swapped-in toy trained on": {
            "questions": 2, "pictured toy's value": 50.0, "swapped-in toy's value": 50.0},
        "graph, swapped-in toy held out": {
            "questions": 1, "pictured toy's value": 0.0, "swapped-in toy's value": 0.0},
    }  # fmt: skip
