"""Retrieval metrics against hand-worked examples, and both scoring paths on real checkpoints."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, tiny_overrides

from mmptm.eval.retrieval import evaluate_retrieval, recall_at_k
from mmptm.train.config import load_run_config
from mmptm.train.trainer import pretrain


def test_recall_at_k_hand_worked():
    # image 0: true text ranks 1st; image 1: 3rd (texts 0 and 2 score higher); image 2: 2nd.
    sim = torch.tensor([[0.9, 0.1, 0.2], [0.8, 0.3, 0.5], [0.1, 0.7, 0.6]])
    r = recall_at_k(sim, ks=(1, 2, 3))
    assert r["i2t_R@1"] == pytest.approx(1 / 3)
    assert r["i2t_R@2"] == pytest.approx(2 / 3)
    assert r["i2t_R@3"] == pytest.approx(1.0)
    # text 0 (column 0): image 0 is best -> rank 1; text 1: image 2 (0.7) beats 0.3 -> rank 2;
    # text 2: image 2 is 0.6 but image 1 has 0.5, image 0 0.2 -> rank 1
    assert r["t2i_R@1"] == pytest.approx(2 / 3)
    assert r["t2i_R@2"] == pytest.approx(1.0)


def test_recall_needs_a_square_matrix():
    with pytest.raises(ValueError, match="square"):
        recall_at_k(torch.zeros(2, 3))


@pytest.mark.parametrize("recipe", ["clip_tiny", "vilt_tiny"])  # dot product / ITM scoring
def test_retrieval_on_a_trained_checkpoint(recipe, tiny_world, tmp_path):
    cfg = load_run_config(
        str(ROOT / f"configs/pretrain/{recipe}.yaml"),
        [*tiny_overrides(tiny_world, tmp_path, recipe), "train.max_steps=2"],
    )
    pretrain(cfg)
    r = evaluate_retrieval(str(tmp_path), split="val", max_items=12, batch_size=5)
    assert r["n"] == 12 and r["chance_R@1"] == pytest.approx(1 / 12)
    for d in ("i2t", "t2i"):
        assert 0 <= r[f"{d}_R@1"] <= r[f"{d}_R@5"] <= r[f"{d}_R@10"] <= 1
