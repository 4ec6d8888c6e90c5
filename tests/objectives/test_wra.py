"""UNITER's word–region alignment: the batched IPOT plan and distance against POT's exact
optimal transport (network simplex), masks, the loss by hand, and WRA in a model's task mix.

Legend: B batch, L text tokens, R regions, D width.
"""

from __future__ import annotations

import numpy as np
import ot
import pytest
import torch

from mmptm.batch import TASK
from mmptm.encoders.base import VocabInfo
from mmptm.fusion.base import FusionOutput
from mmptm.models.pretrain import PretrainModel, data_transforms
from mmptm.objectives.base import trains
from mmptm.objectives.wra import WordRegionAlignment, cosine_cost, ipot, ot_distance
from mmptm.recipe import load_recipe
from mmptm.registry import OBJECTIVES

D = 16


def _exact(cost_LR: np.ndarray) -> tuple[np.ndarray, float]:
    """POT's exact plan and distance between uniform masses on the rows and columns."""
    L, R = cost_LR.shape
    plan = ot.emd(np.full(L, 1 / L), np.full(R, 1 / R), cost_LR)
    return plan, float((plan * cost_LR).sum())


def _padded(xs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths → [B,N,D] with random padding values, and the real mask."""
    N = max(len(x) for x in xs)
    out = torch.randn(len(xs), N, D, generator=torch.Generator().manual_seed(99)) * 5
    real = torch.zeros(len(xs), N, dtype=torch.bool)
    for i, x in enumerate(xs):
        out[i, : len(x)] = x
        real[i, : len(x)] = True
    return out, real


def _matched_pair(L: int, R: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Words and regions with one clear optimal plan: each region's vector, plus a little
    noise, is the state of max(1, L / R) words (each word of max(1, R / L) regions), in a
    random order; unrelated vectors are nearly orthogonal in D = 16."""
    g = torch.Generator().manual_seed(seed)
    k = max(L, R)
    base_KD = torch.randn(k, D, generator=g)
    words = base_KD[torch.arange(L) % min(L, R) if L > R else torch.arange(L)]
    regions = base_KD[torch.arange(R) % min(L, R) if R > L else torch.arange(R)]
    words = words[torch.randperm(L, generator=g)] + 0.05 * torch.randn(L, D, generator=g)
    regions = regions[torch.randperm(R, generator=g)] + 0.05 * torch.randn(R, D, generator=g)
    return words, regions


def test_registered_with_uniter_s_settings() -> None:
    cfg = WordRegionAlignment.Config()
    assert OBJECTIVES.get("wra") is WordRegionAlignment
    assert (cfg.beta, cfg.iterations, cfg.inner, cfg.weight) == (0.5, 50, 1, 0.1)
    with pytest.raises(ValueError, match="wra.beta"):
        WordRegionAlignment.Config(beta=0.0)
    with pytest.raises(ValueError, match="two views"):
        WordRegionAlignment.Config(modalities=["text"])


def test_cosine_cost_by_hand() -> None:
    x = torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])
    y = torch.tensor([[[2.0, 0.0], [0.0, 3.0], [-1.0, 0.0]]])
    want = torch.tensor([[[0.0, 1.0, 2.0], [1 - 2**-0.5, 1 - 2**-0.5, 1 + 2**-0.5]]])
    torch.testing.assert_close(cosine_cost(x, y), want)


@pytest.mark.parametrize("iterations", [50, 1000])
def test_ipot_finds_the_exact_plan_batched_with_padding(iterations: int) -> None:
    """Pairs with one clear optimum (L = R, L = 2R, R = 2L, ...) in one padded batch: every
    row's plan and distance equal POT's exact solution, already at UNITER's 50 iterations."""
    shapes = [(5, 5), (6, 3), (2, 4), (7, 7), (1, 3), (4, 1)]
    pairs = [_matched_pair(L, R, seed) for seed, (L, R) in enumerate(shapes)]
    x, x_real = _padded([w for w, _ in pairs])
    y, y_real = _padded([r for _, r in pairs])
    dist_B, plan_BLR = ot_distance(x, y, x_real, y_real, iterations=iterations)
    for b, (L, R) in enumerate(shapes):
        cost = cosine_cost(pairs[b][0][None].double(), pairs[b][1][None].double())[0]
        plan, d = _exact(cost.numpy())
        got = plan_BLR[b].double().numpy()
        assert np.abs(got[L:]).max(initial=0) == 0 and np.abs(got[:, R:]).max(initial=0) == 0
        np.testing.assert_allclose(got[:L, :R], plan, atol=1e-4)
        assert dist_B[b].item() == pytest.approx(d, abs=1e-4)


def test_ipot_converges_on_random_costs() -> None:
    """Random words and regions (optima close to ties converge slowly): the distance comes
    within 5e-3 of the exact one at UNITER's 50 iterations and within 1e-4 at 2000, and the
    plan keeps the text marginal exactly (the last update is the text side's)."""
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 5), (6, 3), (8, 8), (3, 7), (9, 2)]
    x, x_real = _padded([torch.randn(L, D, generator=g) for L, _ in shapes])
    y, y_real = _padded([torch.randn(R, D, generator=g) for _, R in shapes])
    exact = [
        _exact(cosine_cost(x[b : b + 1, :L].double(), y[b : b + 1, :R].double())[0].numpy())[1]
        for b, (L, R) in enumerate(shapes)
    ]
    for iterations, tol in ((50, 5e-3), (2000, 1e-4)):
        dist_B, plan_BLR = ot_distance(x, y, x_real, y_real, iterations=iterations)
        np.testing.assert_allclose(dist_B.numpy(), exact, atol=tol)
    for b, (L, R) in enumerate(shapes):
        torch.testing.assert_close(plan_BLR[b, :L].sum(1), torch.full((L,), 1 / L))
        torch.testing.assert_close(plan_BLR[b].sum(0)[:R], torch.full((R,), 1 / R), atol=1e-4,
                                   rtol=0)  # fmt: skip


def test_fp32_under_bf16_autocast() -> None:
    """The plan's reciprocal scalings would lose their digits in bf16: under autocast the
    distance is the fp32 one."""
    pairs = [_matched_pair(L, R, seed) for seed, (L, R) in enumerate([(6, 3), (5, 5)])]
    x, x_real = _padded([w for w, _ in pairs])
    y, y_real = _padded([r for _, r in pairs])
    want, _ = ot_distance(x, y, x_real, y_real)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, plan = ot_distance(x.bfloat16(), y.bfloat16(), x_real, y_real)
    assert got.dtype == plan.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=2e-2, rtol=0)  # the states' own bf16 rounding
    exact = ot_distance(x.bfloat16().float(), y.bfloat16().float(), x_real, y_real)[0]
    torch.testing.assert_close(got, exact)


def test_padding_changes_nothing_and_an_empty_side_gives_a_zero_plan() -> None:
    words, regions = _matched_pair(4, 3, seed=5)
    alone_d, alone_plan = ot_distance(
        words[None], regions[None], torch.ones(1, 4, dtype=torch.bool),
        torch.ones(1, 3, dtype=torch.bool),
    )  # fmt: skip
    x, x_real = _padded([words, words[:2]])
    y, y_real = _padded([torch.cat([regions, regions]), regions])
    y_real[0, 3:] = False  # the first row: 3 real regions, then 3 padded (not zeros: copies)
    d, plan = ot_distance(x, y, x_real, y_real)
    torch.testing.assert_close(d[0], alone_d[0])
    torch.testing.assert_close(plan[0, :4, :3], alone_plan[0])
    y_real[1] = False
    plan = ipot(cosine_cost(x, y), x_real, y_real)
    assert plan[1].abs().sum() == 0 and torch.isfinite(plan).all()


def _out(words: torch.Tensor, regions: torch.Tensor, x_real, y_real) -> FusionOutput:
    return FusionOutput(
        hidden={"text": words, "regions": regions},
        mask={"text": x_real, "regions": y_real},
        pooled={},
    )


def test_loss_is_matched_distance_minus_mismatched_by_hand() -> None:
    """One word and one region per pair: the plan is 1 and the distance 1 - cos."""
    words = torch.tensor([[[1.0, 0.0]], [[1.0, 0.0]], [[0.0, 1.0]]], requires_grad=True)
    regions = torch.tensor([[[1.0, 1.0]], [[-1.0, 0.0]], [[0.0, 2.0]]])
    real = torch.ones(3, 1, dtype=torch.bool)
    objective = WordRegionAlignment(WordRegionAlignment.Config())
    labels = torch.tensor([1, 0, 1])
    got = objective(_out(words, regions, real, real), {"itm_labels": labels})
    d = [1 - 2**-0.5, 2.0, 0.0]
    assert got["loss"].item() == pytest.approx((d[0] - d[1] + d[2]) / 3, abs=1e-6)
    assert got["pos"].item() == pytest.approx((d[0] + d[2]) / 2, abs=1e-6)
    assert got["neg"].item() == pytest.approx(d[1], abs=1e-6)
    got["loss"].backward()  # through the cost, the plan held fixed
    assert words.grad is not None and words.grad.abs().sum() > 0
    assert objective(_out(words, regions, real, real), {}) == {}  # no ITM negatives: inactive


def test_wra_needs_an_itm_objective_with_data_side_negatives() -> None:
    objective = WordRegionAlignment(WordRegionAlignment.Config())
    with pytest.raises(ValueError, match="wra contrasts ITM"):
        objective.bind(torch.nn.ModuleDict({"wra": objective}))


def test_uniter_full_trains_wra_on_itm_s_batches() -> None:
    """``task_mix: {itm+wra: 2, ...}``: a batch drawn for the ITM task trains both, and only
    ITM's data side (negatives) runs on it, as UNITER computes its OT loss on ITM batches."""
    cfg = load_recipe("uniter_full_tiny")
    assert cfg.model.task_mix == {"mlm": 2.0, "itm+wra": 2.0, "mrc_kl": 1.0, "mrfr": 1.0}
    assert cfg.model.objectives["wra"].weight == 0.1  # UNITER's itm_ot_lambda
    batch = {TASK: "itm+wra"}
    assert [n for n in cfg.model.objectives if trains(batch, n, {})] == ["itm", "wra"]
    model = PretrainModel(cfg.model, VocabInfo(vocab_size=50))  # bind finds itm
    assert isinstance(model.objectives["wra"], WordRegionAlignment)
    bad = load_recipe("uniter_full_tiny", ["model.task_mix={mlm: 1, itm+wrx: 1}"])
    with pytest.raises(ValueError, match=r"model.task_mix names \['wrx'\]"):
        data_transforms(bad.model, VocabInfo(vocab_size=50))
