"""Span task heads: metrics against hand computations, pooling, the label_set plug-in."""

from __future__ import annotations

import pytest
import torch

from mmptm.modalities.base import DataContext
from mmptm.modalities.labels import LabelSetData
from mmptm.objectives.spans import (
    EntityTyping,
    RelationClassification,
    relation_scores,
    span_pool,
    typing_scores,
)


def test_typing_scores_by_hand():
    # 3 samples, 4 types. Sample 0: pred {0,1}, gold {0}; 1: pred {}, gold {2} + 1 type the
    # vocabulary lacks; 2: pred {1,3}, gold {1,3}.
    pred = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 0, 1]], dtype=torch.bool)
    gold = torch.tensor([[1, 0, 0, 0], [0, 0, 1, 0], [0, 1, 0, 1]], dtype=torch.bool)
    s = typing_scores(pred, gold, torch.tensor([0, 1, 0]))
    # micro: tp = 1 + 0 + 2 = 3, predicted 4, gold 1 + 2 + 2 = 5
    assert s["micro_p"] == pytest.approx(3 / 4) and s["micro_r"] == pytest.approx(3 / 5)
    assert s["micro_f1"] == pytest.approx(2 * 0.75 * 0.6 / 1.35)
    # loose macro: precision over samples with a prediction (0: 1/2, 2: 1), recall over all
    # (0: 1, 1: 0, 2: 1)
    assert s["macro_p"] == pytest.approx(0.75) and s["macro_r"] == pytest.approx(2 / 3)
    assert s["macro_f1"] == pytest.approx(2 * 0.75 * (2 / 3) / (0.75 + 2 / 3))
    assert typing_scores(pred[:0], gold[:0])["micro_f1"] == 0.0


def test_relation_scores_exclude_no_relation():
    NA = 0
    gold = torch.tensor([NA, 1, 2, 2, NA, -1])  # -1: a relation the vocabulary lacks
    pred = torch.tensor([NA, 1, 1, NA, 2, 2])
    s = relation_scores(pred, gold, negative=NA)
    assert s["acc"] == pytest.approx(2 / 6)
    # TACRED: predicted facts = preds != NA (1, 1, 2, 2) = 4, one right (sample 1);
    # gold facts = golds != NA (1, 2, 2, -1) = 4
    assert s["p"] == pytest.approx(1 / 4) and s["r"] == pytest.approx(1 / 4)
    assert s["f1"] == pytest.approx(1 / 4)
    # without a negative class (FewRel) every prediction and gold counts: F1 = accuracy
    s = relation_scores(pred, gold)
    assert s["p"] == s["r"] == s["f1"] == pytest.approx(2 / 6)


def test_span_pool_mean_and_start():
    h = torch.arange(2 * 4 * 2, dtype=torch.float).view(2, 4, 2)
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(span_pool(h, mask, "mean")[0], (h[0, 1] + h[0, 2]) / 2)
    torch.testing.assert_close(span_pool(h, mask, "mean")[1], torch.zeros(2))  # cut off
    torch.testing.assert_close(span_pool(h, mask, "start"), torch.stack([h[0, 1], h[1, 0]]))


def test_label_set_plugin_counts_unknown_names(tmp_path):
    vocab = tmp_path / "labels.txt"
    vocab.write_text("no_relation\nmade_of\nowned_by\n")
    plugin = LabelSetData(
        LabelSetData.Config(names_file=str(vocab)), views=["label_set"], context=DataContext()
    )
    items = [plugin.decode({}, {"labels": x}, None) for x in (["owned_by"], "made_of",
                                                             ["made_of", "lives_in"])]  # fmt: skip
    b = plugin.collate(items)
    torch.testing.assert_close(b["label_set"], torch.tensor([[0, 0, 1], [0, 1, 0], [0, 1, 0.0]]))
    assert b["label_unknown"].tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="list of label names"):
        plugin.decode({}, {"labels": 3}, None)


def test_heads_losses_and_needs(tmp_path):
    vocab = tmp_path / "labels.txt"
    vocab.write_text("no_relation\nmade_of\nowned_by\n")
    rel = RelationClassification(
        RelationClassification.Config(labels=str(vocab), dropout=0.0), width=4
    )
    assert rel.data_needs()["text"].facts == {"spans": {"subj": "subj", "obj": "obj"}}
    assert rel.data_needs()["label_set"].facts == {"names_file": str(vocab)}
    h = torch.randn(2, 5, 4)
    out = type("Out", (), {"hidden": {"text": h}})()
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[:, 1] = True
    batch = {"subj_mask": mask, "obj_mask": mask.roll(1, 1),
             "label_set": torch.tensor([[0, 0, 1.0], [0, 0, 0]])}  # fmt: skip
    logits = rel.logits(out, batch)
    # the second sample's relation is unknown: only the first gives loss
    want = torch.nn.functional.cross_entropy(logits[:1], torch.tensor([2]))
    torch.testing.assert_close(rel(out, batch)["loss"], want)
    with pytest.raises(ValueError, match="negative='none'"):
        RelationClassification(RelationClassification.Config(labels=str(vocab), negative="none"),
                               width=4)  # fmt: skip
    typ = EntityTyping(EntityTyping.Config(labels=str(vocab), dropout=0.0), width=4)
    batch = {"mention_mask": mask, "label_set": torch.tensor([[0, 1, 1.0], [1, 0, 0]])}
    logits = typ.logits(out, batch)
    want = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch["label_set"])
    torch.testing.assert_close(typ(out, batch)["loss"], want)
