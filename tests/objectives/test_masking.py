"""The masking core: selection rate, groups, at-least-one, candidates, seeding.

Legend: B batch, N positions.
"""

from __future__ import annotations

import math

import pytest
import torch

from mmptm.objectives.masking import select_positions


def _candidates(seed: int, B: int, N: int, p_real: float = 0.7) -> torch.Tensor:
    return torch.rand(B, N, generator=torch.Generator().manual_seed(seed)) < p_real


def _groups(seed: int, B: int, N: int) -> torch.Tensor:
    """Word-like groups: ids in [0, N], non-decreasing along N, a new group at ~1/3 of steps."""
    starts_BN = torch.rand(B, N, generator=torch.Generator().manual_seed(seed)) < 0.35
    return torch.cumsum(starts_BN.long(), dim=1)


@pytest.mark.parametrize("prob", [0.15, 0.5])
def test_selection_rate_matches_prob(prob: float) -> None:
    cand_BN = _candidates(0, 64, 128)
    sel_BN = select_positions(cand_BN, prob, torch.Generator().manual_seed(1))
    n = int(cand_BN.sum())
    rate = int(sel_BN.sum()) / n
    # Binomial(n, prob): 5 standard deviations.
    assert abs(rate - prob) < 5 * math.sqrt(prob * (1 - prob) / n), rate


def test_candidates_are_never_violated() -> None:
    cand_BN = _candidates(2, 16, 40)
    cand_BN[3] = False  # a sample without candidates
    groups_BN = _groups(3, 16, 40)
    for groups in (None, groups_BN):
        for seed in range(5):
            g = torch.Generator().manual_seed(seed)
            sel_BN = select_positions(cand_BN, 0.9, g, groups_BN=groups, at_least_one=True)
            assert sel_BN.dtype == torch.bool and sel_BN.shape == cand_BN.shape
            assert not bool((sel_BN & ~cand_BN).any())
            assert not bool(sel_BN[3].any())


def test_groups_are_selected_together_at_the_rate_of_groups() -> None:
    B, N, prob = 64, 96, 0.3
    cand_BN = _candidates(4, B, N)
    groups_BN = _groups(5, B, N)
    sel_BN = select_positions(cand_BN, prob, torch.Generator().manual_seed(6), groups_BN=groups_BN)
    n_groups = picked = 0
    for b in range(B):
        for gid in groups_BN[b][cand_BN[b]].unique():
            in_group = cand_BN[b] & (groups_BN[b] == gid)
            states = sel_BN[b][in_group]
            assert bool(states.all()) or not bool(states.any()), (b, int(gid))
            n_groups += 1
            picked += bool(states.all())
    assert n_groups < int(cand_BN.sum()) / 2  # groups span several positions on average
    # One draw per group, so the rate holds over groups (not over positions).
    rate = picked / n_groups
    assert abs(rate - prob) < 5 * math.sqrt(prob * (1 - prob) / n_groups), rate


@pytest.mark.parametrize("grouped", [False, True])
def test_at_least_one_per_sample_with_candidates(grouped: bool) -> None:
    B, N = 256, 6
    cand_BN = _candidates(7, B, N, p_real=0.4)
    cand_BN[0] = False
    cand_BN[1] = torch.tensor([False, False, False, False, True, False])
    groups_BN = _groups(8, B, N) if grouped else None
    # A small prob leaves most samples empty by chance, so the guarantee does the work.
    sel_BN = select_positions(
        cand_BN, 0.01, torch.Generator().manual_seed(9), groups_BN=groups_BN, at_least_one=True
    )
    has_BN = cand_BN.any(dim=1)
    assert bool(sel_BN[has_BN].any(dim=1).all())
    assert not bool(sel_BN[0].any())
    assert sel_BN[1].tolist() == cand_BN[1].tolist()
    if grouped:  # the forced position brings its whole group
        for b in range(B):
            for gid in groups_BN[b][sel_BN[b]].unique():
                assert bool(sel_BN[b][cand_BN[b] & (groups_BN[b] == gid)].all()), (b, int(gid))
    else:  # exactly one forced position where the first draw selected nothing
        plain_BN = select_positions(cand_BN, 0.01, torch.Generator().manual_seed(9))
        forced_B = has_BN & ~plain_BN.any(dim=1)
        assert int(forced_B.sum()) > B // 4
        assert bool((sel_BN[forced_B].sum(dim=1) == 1).all())
        assert torch.equal(sel_BN[~forced_B], plain_BN[~forced_B])


def test_forced_position_is_uniform_over_candidates() -> None:
    B, N = 4000, 5
    cand_BN = torch.ones(B, N, dtype=torch.bool)
    cand_BN[:, 0] = False
    sel_BN = select_positions(cand_BN, 1e-6, torch.Generator().manual_seed(10), at_least_one=True)
    counts_N = sel_BN.sum(dim=0).float()
    assert counts_N[0] == 0 and int(counts_N.sum()) == B
    expected = B / 4
    assert bool(((counts_N[1:] - expected).abs() < 5 * math.sqrt(expected * 3 / 4)).all())


def test_seeded_and_draw_count() -> None:
    cand_BN = _candidates(11, 8, 20)
    groups_BN = _groups(12, 8, 20)
    for kw in ({}, {"groups_BN": groups_BN}, {"at_least_one": True}):
        g1, g2 = torch.Generator().manual_seed(13), torch.Generator().manual_seed(13)
        assert torch.equal(
            select_positions(cand_BN, 0.4, g1, **kw), select_positions(cand_BN, 0.4, g2, **kw)
        )
        # Callers draw after the selection: the generator must advance by exactly these draws.
        ref = torch.Generator().manual_seed(13)
        torch.rand(8, 21 if "groups_BN" in kw else 20, generator=ref)
        if kw.get("at_least_one"):
            torch.rand(8, 20, generator=ref)
        assert torch.equal(g1.get_state(), ref.get_state()), kw
