"""VQA evaluation I/O: the official accuracy over predictions and the results file."""

from __future__ import annotations

import json

import pytest

from mmptm.eval.vqa import read_results, vqa_accuracy, write_results


def test_accuracy_and_results_round_trip(tmp_path) -> None:
    answers = {1: ["yes"] * 3 + ["no"] * 7, 2: ["2"] * 10, 7: ["cat"] * 10}
    preds = {1: "yes", 2: "Two", 7: "dog"}
    # (0.9 + 1 + 0) / 3 · 100
    assert vqa_accuracy(preds, answers) == pytest.approx(190 / 3)
    with pytest.raises(KeyError):
        vqa_accuracy({99: "yes"}, answers)
    path = tmp_path / "results.json"
    write_results(preds, path)
    rows = json.loads(path.read_text())
    assert rows == [
        {"question_id": 1, "answer": "yes"},
        {"question_id": 2, "answer": "Two"},
        {"question_id": 7, "answer": "dog"},
    ]
    assert all(type(r["question_id"]) is int for r in rows)
    assert read_results(path) == preds
