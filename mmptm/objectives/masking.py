"""Seeded selection of positions to mask, the core of MLM and masked region modelling.

Legend: B batch, N positions (tokens or regions).
"""

from __future__ import annotations

import torch


def select_positions(
    candidates_BN: torch.Tensor,
    prob: float,
    g: torch.Generator,
    *,
    groups_BN: torch.Tensor | None = None,
    at_least_one: bool = False,
) -> torch.Tensor:
    """Bool [B,N]: each candidate position (or group of them) selected with ``prob``.

    ``groups_BN`` (long, ids in [0, N]) selects positions with the same id together: one draw
    per id, so a group is in or out as a whole (whole-word masking); non-candidate positions
    are never selected whatever their group. With ``at_least_one`` a sample left empty by
    chance that has any candidate gets one candidate position, drawn uniformly, selected
    (with its whole group).

    The draws, in order: ``rand(B, N)`` (``rand(B, N + 1)`` with groups), then
    ``rand(B, N)`` only with ``at_least_one``; callers' later draws rely on this.
    """
    candidates_BN = candidates_BN.bool()
    B, N = candidates_BN.shape
    if groups_BN is None:
        draw_BN = torch.rand(B, N, generator=g)
    else:
        draw_BN = torch.rand(B, N + 1, generator=g).gather(1, groups_BN)
    selected_BN = candidates_BN & (draw_BN < prob)
    if at_least_one:
        # UNITER masks at least one region: an empty sample would carry no signal.
        score_BN = torch.rand(B, N, generator=g).masked_fill(~candidates_BN, 2.0)
        forced_B = score_BN.argmin(dim=1)
        need_B = candidates_BN.any(dim=1) & ~selected_BN.any(dim=1)
        if groups_BN is None:
            selected_BN[need_B, forced_B[need_B]] = True
        else:
            group_B1 = groups_BN.gather(1, forced_B.unsqueeze(1))
            selected_BN |= need_B.unsqueeze(1) & candidates_BN & (groups_BN == group_B1)
    return selected_BN
