"""The pair-of-images head (NLVR2): two rows per pair, the pooled vectors joined, by hand."""

from __future__ import annotations

import pytest
import torch

from mmptm.fusion.base import FusionOutput
from mmptm.modalities.pair import read_truth
from mmptm.objectives.nlvr2 import ImagePairHead, PairRows


def _batch():
    return {
        "input_ids": torch.tensor([[5, 6, 0], [7, 8, 9]]),
        "region_feats": torch.arange(2 * 1 * 2, dtype=torch.float).reshape(2, 1, 2),
        "region_boxes": torch.ones(2, 1, 4),
        "region_mask": torch.ones(2, 1, dtype=torch.bool),
        "region_probs": torch.ones(2, 1, 5),
        "right_region_feats": -torch.arange(2 * 2 * 2, dtype=torch.float).reshape(2, 2, 2),
        "right_region_boxes": torch.zeros(2, 2, 4),
        "right_region_mask": torch.tensor([[True, False], [True, True]]),
        "pair_labels": torch.tensor([1, 0]),
        "__key__": ["a", "b"],
        "__source__": "",
    }


def test_pair_rows_put_the_statement_with_each_image():
    out = PairRows()(_batch(), torch.Generator())
    assert out["input_ids"].tolist() == [[5, 6, 0], [5, 6, 0], [7, 8, 9], [7, 8, 9]]
    assert out["__key__"] == ["a", "a", "b", "b"] and out["__source__"] == ""
    assert out["pair_labels"].tolist() == [1, 0]  # one label a pair
    feats = out["region_feats"]
    assert feats.shape == (4, 2, 2)
    # rows: left0 (one region, padded), right0, left1, right1
    assert feats[0].tolist() == [[0.0, 1.0], [0.0, 0.0]]
    assert feats[1].tolist() == [[-0.0, -1.0], [-2.0, -3.0]]
    assert feats[2].tolist() == [[2.0, 3.0], [0.0, 0.0]]
    assert out["region_mask"].tolist() == [[True, False], [True, False], [True, False],
                                           [True, True]]  # fmt: skip
    assert "region_probs" not in out and "right_region_feats" not in out
    batch = {"input_ids": torch.zeros(2, 3)}
    assert PairRows()(batch, torch.Generator()) is batch  # not a pair batch


def test_head_joins_the_two_rows_and_scores_true_false():
    torch.manual_seed(0)
    head = ImagePairHead(ImagePairHead.Config(), width=3)
    pooled = torch.randn(4, 3)
    out = FusionOutput(hidden={}, mask={}, pooled={"joint": pooled})
    labels = torch.tensor([1, 0])
    got = head(out, {"pair_labels": labels})
    with torch.no_grad():
        logits = head.head(torch.stack([torch.cat([pooled[0], pooled[1]]),
                                        torch.cat([pooled[2], pooled[3]])]))  # fmt: skip
    want = -(torch.log_softmax(logits, -1)[[0, 1], labels]).mean()
    torch.testing.assert_close(got["loss"], want)
    assert got["acc"].item() == pytest.approx((logits.argmax(-1) == labels).float().mean().item())
    with pytest.raises(ValueError, match="odd number of rows"):
        head.logits(FusionOutput(hidden={}, mask={}, pooled={"joint": torch.randn(3, 3)}))
    assert head(out, {}) == {}


def test_truth_labels():
    assert [read_truth(v) for v in ("True", "false", " TRUE ", True, False)] == [1, 0, 1, 1, 0]
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="label must be True or False"):
            read_truth(bad)
