"""FLOP counting against hand counts, peak FLOP/s of known GPUs, MFU in metrics.jsonl."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TEXT_MLM, text_mlm_overrides
from torch import nn

from mmptm.layers.transformer import TransformerConfig, TransformerStack
from mmptm.recipe import load_run_config
from mmptm.train.flops import FlopCount, known_peak, peak_flops
from mmptm.train.parallel import checkpoint_blocks
from mmptm.train.trainer import pretrain

B, N, C, D = 2, 5, 8, 16  # batch, tokens, input width, model width


def _count(model: nn.Module, recomputed=()) -> int:
    count = FlopCount(recomputed)
    x = torch.randn(B, N, C)
    with count.forward():
        y = model(x).sum()
    with count.backward():
        y.backward()
    return count.flops


def _hand_count(layers: int) -> int:
    """A Linear C→D (its input needs no gradient) then pre-LN blocks (4 projections D→D,
    scores and weighted values over N keys, MLP D→4D→D); 2·m·n·k per product."""
    linear = 2 * B * N * C * D
    products = 4 * 2 * B * N * D * D + 2 * 2 * B * N * D * 4 * D
    attention = 2 * B * N * N * D  # one of its 2 products, over the heads together
    # backward: input and weight gradients (2 products each), weights only for the first;
    # attention's 4 gradient products and its scores again (torch counts them: fused
    # kernels recompute them)
    return linear * 2 + layers * (products * 3 + attention * (2 + 5))


def _model(layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    cfg = TransformerConfig(layers=layers, heads=2, dropout=0.0, attn_dropout=0.0)
    return nn.Sequential(nn.Linear(C, D), TransformerStack(D, cfg))


def test_flops_of_a_step_are_the_hand_count():
    assert _count(_model()) == _hand_count(2)
    assert _count(nn.Sequential(nn.Linear(C, D))) == _hand_count(0)


def test_a_recomputed_forward_is_not_counted_again():
    model = _model()
    blocks = checkpoint_blocks(model, ["TransformerBlock"])
    names = [n for n, m in model.named_modules() if m in blocks]
    assert names == ["1.blocks.0", "1.blocks.1"]
    assert _count(model, names) == _hand_count(2)
    # without taking it off, each block's forward counts twice
    forward = 4 * 2 * B * N * D * D + 2 * 2 * B * N * D * 4 * D + 2 * 2 * B * N * N * D
    assert _count(model) == _hand_count(2) + 2 * forward


@pytest.mark.parametrize(
    ("name", "peak"),
    [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
     ("NVIDIA H200", 989e12), ("NVIDIA GH200 480GB", 989e12), ("NVIDIA H20", 148e12),
     ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A100-PCIE-40GB", 312e12), ("NVIDIA L4", 121e12),
     ("NVIDIA L40S", 362e12), ("NVIDIA B200", 2.25e15), ("AMD Instinct MI300X", 1307e12),
     ("NVIDIA GeForce RTX 3090", None)],
)  # fmt: skip
def test_known_gpus_peak_flops(name, peak):
    assert known_peak(name) == peak


def test_peak_flops_is_the_setting_or_none_on_cpu():
    cpu = torch.device("cpu")
    assert peak_flops(cpu) is None
    assert peak_flops(cpu, 2e12) == 2e12


def test_metrics_have_the_flops_of_a_step_once_and_mfu_per_row(tiny_world, tmp_path):
    run = tmp_path / "run"
    cfg = load_run_config(TEXT_MLM, [*text_mlm_overrides(tiny_world, run), "train.max_steps=3",
                                     "train.peak_flops=1e12"])  # fmt: skip
    pretrain(cfg)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [("flops_per_step" in r) for r in rows] == [True, False, False]
    flops = rows[0]["flops_per_step"]
    # 4 captions of >= 3 tokens through a width-32 layer (>= 4 products of 2·32·32 per token)
    assert flops > 4 * 3 * 4 * 2 * 32 * 32 * 3
    for r in rows:  # the FLOP/s of the logged samples/s (4 samples a step) over the peak
        assert r["mfu"] == pytest.approx(flops * r["samples_per_s"] / 4 / 1e12, rel=0.02)
