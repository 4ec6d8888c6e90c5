"""The typed output every fusion module returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class FusionOutput:
    """Per-modality hidden states and pooled vectors.

    ``hidden[m]`` is [B,N_m,D] and ``mask[m]`` [B,N_m] for each modality m in the batch;
    ``pooled[m]`` is [B,D]. Fusion modules with cross-modal layers also give
    ``pooled["joint"]``: the pooled vector of the pair (ITM, VQA heads read it).

    ``unimodal[m]`` [B,D] is modality m pooled *before* any cross-modal layer (what an
    ALBEF-style contrastive loss aligns ahead of fusion); ``PretrainModel.fuse`` fills it
    with the pooled encoder tokens where the fusion module has no unimodal stage of its own.
    ``repair(rows)`` fuses again with modality m's rows taken at ``rows[m]`` (index [B'],
    any length) without re-encoding: the pairs of hard negatives.
    """

    hidden: dict[str, torch.Tensor]
    mask: dict[str, torch.Tensor]
    pooled: dict[str, torch.Tensor]
    unimodal: dict[str, torch.Tensor] = field(default_factory=dict)
    repair: Callable[[dict[str, torch.Tensor]], FusionOutput] | None = None


def pool(x_BND: torch.Tensor, mask_BN: torch.Tensor, how: str) -> torch.Tensor:
    """Pool a token sequence: ``first`` token (CLS) or masked ``mean``."""
    if how == "first":
        return x_BND[:, 0]
    if how == "mean":
        m_BN1 = mask_BN.unsqueeze(-1).to(x_BND.dtype)
        return (x_BND * m_BN1).sum(1) / m_BN1.sum(1).clamp_min(1.0)
    raise ValueError(f"unknown pooling {how!r}; choices: first, mean")
