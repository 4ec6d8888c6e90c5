"""Region selection (referring expressions): IoU, targets, the loss and accuracy by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.ops import box_iou as tv_box_iou

from mmptm.fusion.base import FusionOutput
from mmptm.modalities.refexp import read_box
from mmptm.objectives.refexp import RegionSelection, box_iou, region_targets


def _boxes(n: int, g: torch.Generator) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=g) * 0.7
    return torch.cat([xy, xy + 0.05 + torch.rand(n, 2, generator=g) * 0.3], -1)


def test_box_iou_matches_torchvision():
    g = torch.Generator().manual_seed(0)
    a, b = _boxes(50, g), _boxes(50, g)
    torch.testing.assert_close(box_iou(a, b), tv_box_iou(a, b).diagonal())
    # by hand: two unit-area boxes overlapping by half → 0.5 / 1.5
    one = torch.tensor([[0.0, 0.0, 1.0, 1.0]])
    assert box_iou(one, torch.tensor([[0.5, 0.0, 1.5, 1.0]])).item() == pytest.approx(1 / 3)
    assert box_iou(torch.zeros(1, 4), torch.zeros(1, 4)).item() == 0.0  # empty: 0, not NaN


def test_targets_take_the_best_real_region_above_the_threshold():
    gold = torch.tensor([[0.0, 0.0, 0.4, 0.4], [0.0, 0.0, 0.4, 0.4]])
    boxes = torch.tensor([
        [[0.5, 0.5, 1.0, 1.0], [0.0, 0.0, 0.4, 0.3], [0.0, 0.0, 0.4, 0.4]],  # IoU 0, .75, 1
        [[0.0, 0.0, 0.4, 0.1], [0.0, 0.0, 0.4, 0.4], [0.0, 0.0, 0.0, 0.0]],  # .25, 1 (pad)
    ])  # fmt: skip
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert region_targets(boxes, mask, gold, 0.5).tolist() == [2, -1]
    assert region_targets(boxes, mask, gold, 0.2).tolist() == [2, 0]


def _out(h_BRD: torch.Tensor, mask_BR: torch.Tensor) -> FusionOutput:
    return FusionOutput(hidden={"regions": h_BRD}, mask={"regions": mask_BR}, pooled={})


def test_loss_is_cross_entropy_over_the_real_regions_and_acc_is_iou_hits():
    torch.manual_seed(0)
    head = RegionSelection(RegionSelection.Config(), width=8)
    boxes = torch.tensor([
        [[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0], [0.0, 0.5, 0.5, 1.0]],
        [[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]],
    ])  # fmt: skip
    mask = torch.tensor([[True, True, True], [True, True, False]])
    gold = torch.tensor([[0.5, 0.5, 1.0, 0.95], [0.0, 0.0, 0.5, 0.5]])  # regions 1 and 0
    h = torch.randn(2, 3, 8)
    batch = {"region_boxes": boxes, "ref_box": gold}
    got = head(_out(h, mask), batch)
    with torch.no_grad():
        s = head.head(h).squeeze(-1)
    want = (-torch.log_softmax(s[0], 0)[1] - torch.log_softmax(s[1, :2], 0)[0]) / 2
    torch.testing.assert_close(got["loss"], want)
    picks = [int(s[0].argmax()), int(s[1, :2].argmax())]
    hits = [picks[0] == 1, picks[1] == 0]  # the other boxes overlap neither gold box
    assert got["acc"].item() == pytest.approx(sum(hits) / 2)
    # padding: a pad region's state changes nothing
    h2 = h.clone()
    h2[1, 2] = 100.0
    torch.testing.assert_close(head(_out(h2, mask), batch)["loss"], got["loss"])
    got["loss"].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in head.parameters())


def test_no_target_no_loss_and_acc_counts_the_miss():
    head = RegionSelection(RegionSelection.Config(), width=4)
    boxes = torch.tensor([[[0.0, 0.0, 0.1, 0.1], [0.2, 0.2, 0.3, 0.3]]])
    batch = {"region_boxes": boxes, "ref_box": torch.tensor([[0.6, 0.6, 1.0, 1.0]])}
    got = head(_out(torch.randn(1, 2, 4), torch.ones(1, 2, dtype=torch.bool)), batch)
    assert got["loss"].item() == 0.0 and got["acc"].item() == 0.0
    assert head(_out(torch.randn(1, 2, 4), torch.ones(1, 2, dtype=torch.bool)),
                {"region_boxes": boxes}) == {}  # fmt: skip


def test_config_and_box_errors_are_one_line():
    with pytest.raises(ValueError, match="target_iou"):
        RegionSelection(RegionSelection.Config(target_iou=0.0), width=4)
    head = RegionSelection(RegionSelection.Config(), width=4)
    with pytest.raises(ValueError, match="region_boxes"):
        head.logits(_out(torch.randn(1, 3, 4), torch.ones(1, 3, dtype=torch.bool)),
                    {"region_boxes": torch.zeros(1, 2, 4)})  # fmt: skip
    assert read_box([0, 0.5, 1, 1]) == [0.0, 0.5, 1.0, 1.0]
    for bad in (None, [0, 0, 1], [0, 0, 1, "1"], [0.5, 0, 0.4, 1], [0, 0, math.nan, 1]):
        with pytest.raises(ValueError, match="ref_box"):
            read_box(bad)
