"""The typed output every fusion module returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FusionOutput:
    """Per-modality hidden states and pooled vectors.

    ``hidden[m]`` is [B,N_m,D] and ``mask[m]`` [B,N_m] for each modality m in the batch;
    ``pooled[m]`` is [B,D]. Fusion modules with cross-modal layers also give
    ``pooled["joint"]``: the pooled vector of the pair (ITM, VQA heads read it).
    """

    hidden: dict[str, torch.Tensor]
    mask: dict[str, torch.Tensor]
    pooled: dict[str, torch.Tensor]


def pool(x_BND: torch.Tensor, mask_BN: torch.Tensor, how: str) -> torch.Tensor:
    """Pool a token sequence: ``first`` token (CLS) or masked ``mean``."""
    if how == "first":
        return x_BND[:, 0]
    if how == "mean":
        m_BN1 = mask_BN.unsqueeze(-1).to(x_BND.dtype)
        return (x_BND * m_BN1).sum(1) / m_BN1.sum(1).clamp_min(1.0)
    raise ValueError(f"unknown pooling {how!r}; choices: first, mean")
