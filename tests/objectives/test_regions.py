"""Masked region modelling: masking statistics (data side); MRC, MRC-kl, MRFR losses.

Legend: B batch, R regions, F feature dim, C classes, D width, M masked regions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mmptm.encoders.base import VocabInfo
from mmptm.encoders.regions import RegionEncoder
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.regions import (
    MaskedRegionClassification,
    MaskedRegionClassificationKL,
    MaskedRegionFeatureRegression,
    MaskRegions,
)
from mmptm.registry import OBJECTIVES

VOCAB = VocabInfo(vocab_size=10)
WIDTH, FEAT, CLASSES = 16, 8, 6


def _big_batch(seed: int = 0, B: int = 512, R: int = 36) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, R + 1, (B,), generator=g)
    counts[:5] = 0  # samples with no real region at all
    mask = torch.arange(R)[None, :] < counts[:, None]
    feats = torch.rand(B, R, FEAT, generator=g) + 0.5  # never 0, so zeroing is visible
    return {"region_feats": feats * mask[..., None], "region_mask": mask}


def _mask(batch: dict, seed: int = 1, mask_prob: float = 0.15) -> dict[str, torch.Tensor]:
    t = MaskedRegionClassification.data_transform(
        MaskedRegionClassification.Config(mask_prob=mask_prob), VOCAB
    )
    return t({k: v.clone() for k, v in batch.items()}, torch.Generator().manual_seed(seed))


def test_registered_and_one_shared_data_side() -> None:
    assert OBJECTIVES.get("mrc") is MaskedRegionClassification
    assert OBJECTIVES.get("mrc_kl") is MaskedRegionClassificationKL
    assert OBJECTIVES.get("mrfr") is MaskedRegionFeatureRegression
    ts = [
        cls.data_transform(cls.Config(), VOCAB)
        for cls in (
            MaskedRegionClassification,
            MaskedRegionClassificationKL,
            MaskedRegionFeatureRegression,
        )
    ]
    assert ts[0] == ts[1] == ts[2] and MaskRegions.shared and MaskRegions.data_priority == 20
    other = MaskedRegionFeatureRegression.data_transform(
        MaskedRegionFeatureRegression.Config(mask_prob=0.3), VOCAB
    )
    assert other != ts[0]
    with pytest.raises(ValueError, match="mask_prob"):
        MaskedRegionClassification.data_transform(
            MaskedRegionClassification.Config(mask_prob=0.0), VOCAB
        )


def test_mask_regions_statistics() -> None:
    batch = _big_batch()
    out = _mask(batch)
    real, masked = batch["region_mask"], out["region_masked"]
    assert masked.dtype == torch.bool and masked.shape == real.shape
    assert not bool((masked & ~real).any()), "padding must never be masked"
    has_real = real.any(1)
    assert bool(masked[has_real].any(1).all()), "every sample with regions masks >= 1"
    assert not bool(masked[~has_real].any())
    # ~15% of real regions; forcing one region into the samples left empty by chance adds a
    # little (at most P(none) = 0.85^n per sample, ~1% of regions for these sizes)
    frac = masked.sum().item() / real.sum().item()
    assert 0.145 < frac < 0.175, frac
    # masked features zeroed, others untouched; targets keep the originals
    assert bool((out["region_feats"][masked] == 0).all())
    assert torch.equal(out["region_feats"][~masked], batch["region_feats"][~masked])
    assert torch.equal(out["region_target_feats"], batch["region_feats"])


def test_mask_regions_seeded_and_skips_batches_without_regions() -> None:
    batch = _big_batch(B=8, R=10)
    a, b, c = _mask(batch, seed=3), _mask(batch, seed=3), _mask(batch, seed=4)
    assert torch.equal(a["region_masked"], b["region_masked"])
    assert not torch.equal(a["region_masked"], c["region_masked"])
    text_only = {"input_ids": torch.ones(2, 3, dtype=torch.long)}
    got = _mask(text_only)
    assert list(got) == ["input_ids"] and torch.equal(got["input_ids"], text_only["input_ids"])


def test_mask_regions_negatives_have_no_masked_region() -> None:
    batch = _big_batch(B=256, R=20)
    batch["region_mask"][:5] = True  # every sample has regions here
    itm = (torch.arange(256) % 2).long()  # odd samples are positives
    batch["itm_labels"] = itm
    out = _mask(batch)
    masked = out["region_masked"]
    assert not bool(masked[itm == 0].any())
    assert bool(masked[itm == 1].any(1).all())
    # negatives' regions are zeroed like the positives' (no hint for ITM), at the same rate
    zeroed = (out["region_feats"] == 0).all(-1) & batch["region_mask"]
    rate = [zeroed[itm == v].sum().item() / batch["region_mask"][itm == v].sum().item()
            for v in (0, 1)]  # fmt: skip
    assert abs(rate[0] - rate[1]) < 0.03, rate


# ---------------------------------------------------------------------------------------------
# Loss sides


def _out_and_batch(seed: int = 0, B: int = 3, R: int = 5):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, R, WIDTH, generator=g, requires_grad=True)
    masked = torch.zeros(B, R, dtype=torch.bool)
    masked[0, 1] = masked[0, 3] = masked[2, 0] = masked[2, 4] = True
    probs = torch.softmax(3 * torch.randn(B, R, CLASSES, generator=g), -1)
    probs[0, 3, 2] = 0.0  # a zero probability: KL must treat 0·log 0 as 0
    probs[0, 3] /= probs[0, 3].sum()
    batch = {
        "region_masked": masked,
        "region_probs": probs,
        "region_labels": torch.randint(0, CLASSES, (B, R), generator=g),
        "region_target_feats": torch.randn(B, R, FEAT, generator=g),
    }
    batch["region_labels"][2, 0] = -1  # a masked region without a label
    out = FusionOutput(hidden={"regions": hidden}, mask={}, pooled={})
    return out, batch


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _head_outputs(obj: nn.Module, out: FusionOutput, batch: dict) -> np.ndarray:
    with torch.no_grad():
        h = out.hidden["regions"][batch["region_masked"]]
        return obj.head(h).double().numpy()


def test_mrc_cross_entropy_against_argmax_of_probs() -> None:
    torch.manual_seed(0)
    obj = MaskedRegionClassification(
        MaskedRegionClassification.Config(num_classes=CLASSES), width=WIDTH
    )
    out, batch = _out_and_batch()
    res = obj(out, batch)
    logits = _head_outputs(obj, out, batch)
    target = batch["region_probs"][batch["region_masked"]].numpy().argmax(-1)
    want = -_log_softmax(logits)[np.arange(len(target)), target].mean()
    assert res["loss"].item() == pytest.approx(want, rel=1e-5)
    assert res["acc"].item() == pytest.approx((logits.argmax(-1) == target).mean())
    res["loss"].backward()
    assert out.hidden["regions"].grad is not None


def test_mrc_with_region_labels_ignores_unlabelled() -> None:
    torch.manual_seed(0)
    cfg = MaskedRegionClassification.Config(num_classes=CLASSES, target="labels")
    obj = MaskedRegionClassification(cfg, width=WIDTH)
    out, batch = _out_and_batch()
    res = obj(out, batch)
    logits = _head_outputs(obj, out, batch)
    target = batch["region_labels"][batch["region_masked"]].numpy()
    keep = target >= 0
    assert keep.sum() == 3
    want = -_log_softmax(logits)[keep][np.arange(3), target[keep]].mean()
    assert res["loss"].item() == pytest.approx(want, rel=1e-5)


def test_mrc_kl_matches_numpy_kl() -> None:
    torch.manual_seed(0)
    obj = MaskedRegionClassificationKL(
        MaskedRegionClassificationKL.Config(num_classes=CLASSES), width=WIDTH
    )
    out, batch = _out_and_batch()
    res = obj(out, batch)
    logq = _log_softmax(_head_outputs(obj, out, batch))
    p = batch["region_probs"][batch["region_masked"]].double().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - logq), 0.0)
    want = terms.sum(-1).mean()
    assert np.isfinite(res["loss"].item())
    assert res["loss"].item() == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError, match="classes"):
        MaskedRegionClassificationKL(
            MaskedRegionClassificationKL.Config(num_classes=CLASSES + 1), width=WIDTH
        )(out, batch)


def test_mrfr_matches_independent_mse_and_reads_feature_dim_from_encoder() -> None:
    torch.manual_seed(0)
    encoders = nn.ModuleDict(
        {"regions": RegionEncoder(RegionEncoder.Config(feature_dim=FEAT), width=WIDTH)}
    )
    obj = MaskedRegionFeatureRegression(
        MaskedRegionFeatureRegression.Config(), width=WIDTH, encoders=encoders
    )
    out, batch = _out_and_batch()
    res = obj(out, batch)
    pred = _head_outputs(obj, out, batch)
    assert pred.shape == (4, FEAT)
    target = batch["region_target_feats"][batch["region_masked"]].double().numpy()
    want = ((pred - target) ** 2).sum(-1).mean()
    assert res["loss"].item() == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError, match="feature_dim"):
        MaskedRegionFeatureRegression(
            MaskedRegionFeatureRegression.Config(), width=WIDTH, encoders=nn.ModuleDict()
        )


@pytest.mark.parametrize(
    "make",
    [
        lambda: MaskedRegionClassification(
            MaskedRegionClassification.Config(num_classes=CLASSES), width=WIDTH
        ),
        lambda: MaskedRegionClassificationKL(
            MaskedRegionClassificationKL.Config(num_classes=CLASSES), width=WIDTH
        ),
        lambda: MaskedRegionFeatureRegression(
            MaskedRegionFeatureRegression.Config(feature_dim=FEAT), width=WIDTH
        ),
    ],
)
def test_empty_masked_set_gives_zero_loss_with_graph(make) -> None:
    obj = make()
    out, batch = _out_and_batch()
    batch["region_masked"] = torch.zeros_like(batch["region_masked"])
    res = obj(out, batch)
    assert res["loss"].item() == 0.0 and torch.isfinite(res["loss"])
    res["loss"].backward()  # still part of the graph
    assert obj.head[0].weight.grad is not None
    # and an objective whose data side did not run on this batch sits it out
    assert obj(out, {}) == {}
