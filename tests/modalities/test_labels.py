"""Targets in a sample's json: class labels and VQA answers."""

from __future__ import annotations

import pytest

from mmptm.modalities import DataContext
from mmptm.modalities.labels import AnswerData, LabelData


def test_labels_by_name_or_index_and_bad_ones_named():
    plugin = LabelData(LabelData.Config(), views=["label"], context=DataContext())
    decoded = [plugin.decode({}, {"label": x}, None) for x in ("entailment", 2, "neutral")]
    assert plugin.collate(decoded)["labels"].tolist() == [0, 2, 1]
    for bad in ("maybe", 3, None, True):
        with pytest.raises(ValueError, match="is not one of"):
            plugin.decode({}, {"label": bad}, None)
    yes_no = LabelData(
        LabelData.Config(names=["no", "yes"]), views=["label"], context=DataContext()
    )
    assert yes_no.decode({}, {"label": "yes"}, None)["labels"] == 1


def test_answers_question_ids_and_types_with_defaults():
    plugin = AnswerData(AnswerData.Config(), views=["answers"], context=DataContext())
    a = plugin.decode({}, {"answers": ["2", 2], "question_id": 7, "answer_type": "number"}, None)
    b = plugin.decode({}, {"question": "unannotated"}, None)
    batch = plugin.collate([a, b])
    assert batch["answers"] == [["2", "2"], []]
    assert batch["question_id"].tolist() == [7, -1]
    assert batch["answer_type"] == ["number", ""]
    with pytest.raises(ValueError, match="answers must be a list"):
        plugin.decode({}, {"answers": "yes"}, None)
