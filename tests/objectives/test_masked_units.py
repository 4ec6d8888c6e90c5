"""Masked units (VideoBERT visual words): masking statistics, the tied loss, learning, ITM."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mmptm.config import from_dict
from mmptm.encoders.base import VocabInfo
from mmptm.encoders.features import UnitsEncoder
from mmptm.fusion.base import FusionOutput
from mmptm.models.pretrain import PretrainModel, data_transforms
from mmptm.objectives.itm import ImageTextMatching
from mmptm.objectives.masked_units import IGNORE, MaskedUnits
from mmptm.recipe import ModelConfig

VOCAB = VocabInfo(vocab_size=20, special_ids=frozenset({0, 1, 2, 3, 4}))
K = 12


def _transform(**cfg):
    return MaskedUnits.data_transform(MaskedUnits.Config(**cfg), VOCAB)


def _big_batch(prefix: str = "") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, K, (256, 64), generator=g)
    lengths = torch.randint(1, 65, (256,), generator=g)
    real = torch.arange(64)[None] < lengths[:, None]
    return {f"{prefix}unit_ids": ids.masked_fill(~real, 0), f"{prefix}unit_mask": real}


def test_masking_statistics_and_labels() -> None:
    batch = _big_batch()
    ids, real = batch["unit_ids"].clone(), batch["unit_mask"].clone()
    out = _transform()(batch, torch.Generator().manual_seed(1))
    labels, masked = out["unit_labels"], out["unit_masked"]
    selected = labels != IGNORE
    assert not bool((selected & ~real).any()) and not bool((masked & ~selected).any())
    frac = selected.sum().item() / real.sum().item()
    assert abs(frac - 0.15) < 0.01, frac
    assert abs(masked.sum().item() / selected.sum().item() - 0.8) < 0.03
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(out["unit_ids"], ids)  # ids stay; the encoder swaps in [MASK]


def test_views_other_sources_and_itm_negatives() -> None:
    batch = _big_batch("units2_")
    out = _transform(modality="units2")(batch, torch.Generator().manual_seed(1))
    assert "units2_unit_labels" in out and "units2_unit_masked" in out
    assert "unit_labels" not in out
    text_only = {"input_ids": torch.ones(2, 3, dtype=torch.long)}
    assert _transform()(dict(text_only), torch.Generator()) == text_only
    with pytest.raises(ValueError, match="mask_prob"):
        _transform(mask_prob=0.0)


def test_itm_swaps_every_unit_key_and_negatives_carry_no_unit_labels() -> None:
    g = torch.Generator().manual_seed(0)
    B = 64
    rows = torch.arange(B)
    ids = torch.stack([rows % K, rows // K, rows % K, rows // K, rows % K], dim=1)  # row b's code
    batch = {
        "input_ids": rows[:, None].repeat(1, 3),
        "unit_ids": ids,
        "unit_mask": torch.arange(5)[None] < (rows[:, None] % 4 + 2),
    }
    orig = {k: v.clone() for k, v in batch.items()}
    cfgs = {
        "itm": ImageTextMatching.Config(swap_keys=["unit_*"]),
        "masked_units": MaskedUnits.Config(mask_prob=0.5),
    }
    for t in data_transforms(ModelConfig(objectives=cfgs), VOCAB):  # ITM first, then masking
        batch = t(batch, g)
    pos = batch["itm_labels"] == 1
    assert 0 < pos.sum() < B
    assert torch.equal(batch["input_ids"], orig["input_ids"])  # the text stays
    source = batch["unit_ids"][:, 0] + K * batch["unit_ids"][:, 1]  # whose units each row has
    assert torch.equal(source == rows, pos)
    assert torch.equal(batch["unit_ids"], orig["unit_ids"][source])
    assert torch.equal(batch["unit_mask"], orig["unit_mask"][source])  # masks travel along
    assert bool((batch["unit_labels"][~pos] == IGNORE).all())
    assert bool((batch["unit_labels"][pos] != IGNORE).any())
    assert bool(batch["unit_masked"][~pos].any())  # negatives are masked all the same


def _encoders(width: int = 16) -> nn.ModuleDict:
    torch.manual_seed(0)
    return nn.ModuleDict(
        {"units": UnitsEncoder(UnitsEncoder.Config(num_units=K), width=width, name="units")}
    )


def test_loss_is_tied_cross_entropy_at_labelled_steps_only() -> None:
    encoders = _encoders()
    head = MaskedUnits(MaskedUnits.Config(), width=16, encoders=encoders)
    assert "units" not in dict(head.named_modules()) and head.bias.shape == (K,)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 6, 16, generator=g)
    labels = torch.full((3, 6), IGNORE)
    labels[0, 1], labels[1, 4], labels[2, 0] = 3, 11, 0
    out = head(FusionOutput({"units": h}, {}, {}), {"unit_labels": labels})
    W = encoders["units"].unit.weight
    losses, hits = [], []
    for b, t in [(0, 1), (1, 4), (2, 0)]:  # one step at a time
        z = head.transform(h[b, t]) @ W.T + head.bias
        losses.append(torch.logsumexp(z, 0) - z[labels[b, t]])
        hits.append(float(z.argmax() == labels[b, t]))
    torch.testing.assert_close(out["loss"], torch.stack(losses).mean())
    assert out["acc"].item() == pytest.approx(sum(hits) / 3)
    out["loss"].backward()
    assert W.grad is not None and W.grad.abs().sum() > 0  # the output layer is the table
    empty = head(FusionOutput({"units": h}, {}, {}), {"unit_labels": torch.full((3, 6), IGNORE)})
    assert empty["loss"].item() == 0.0
    assert head(FusionOutput({"units": h}, {}, {}), {}) == {}


def test_needs_a_units_encoder() -> None:
    with pytest.raises(ValueError, match="not a units encoder"):
        MaskedUnits(MaskedUnits.Config(modality="video"), width=16, encoders=_encoders())


def test_loss_falls_on_a_learnable_sequence_task() -> None:
    """Each clip repeats one unit: a masked step's id is what the other steps show."""
    cfg = from_dict(
        ModelConfig,
        {
            "width": 32,
            "encoders": {"units": {"type": "units", "num_units": K, "dropout": 0.0}},
            "fusion": {
                "type": "single_stream",
                "transformer": {"layers": 1, "heads": 2, "dropout": 0.0, "attn_dropout": 0.0},
            },
            "objectives": {"masked_units": {"type": "masked_units", "mask_prob": 0.3}},
        },
    )
    torch.manual_seed(0)
    model = PretrainModel(cfg, VOCAB)
    (mask_units,) = data_transforms(cfg, VOCAB)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    history = []
    for _ in range(60):
        ids = torch.randint(0, K, (32, 1), generator=g).repeat(1, 8)
        batch = mask_units(
            {"unit_ids": ids, "unit_mask": torch.ones_like(ids, dtype=torch.bool)}, g
        )
        out = model(batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        history.append(
            (out.terms["masked_units_loss"].item(), out.terms["masked_units_acc"].item())
        )
    first = sum(loss for loss, _ in history[:10]) / 10
    last = sum(loss for loss, _ in history[-10:]) / 10
    assert first > 1.5  # log K = 2.48 at the start
    assert last < 0.3 * first, (first, last)
    assert sum(acc for _, acc in history[-10:]) / 10 > 0.8
