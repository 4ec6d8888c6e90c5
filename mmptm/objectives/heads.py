"""Heads objectives share: the language-model output head (a BERT transform, then logits over
the vocabulary through the text encoder's word embeddings, tied, plus a bias) and the task
heads' two-layer classifier.

Legend: M positions, D width, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.encoders.base import init_weights


class TiedHead(nn.Module):
    """Linear → GELU → LayerNorm, then the tied output layer (``word`` is not a submodule: a
    list keeps the shared embedding out of this module's state dict)."""

    def __init__(self, width: int, word: nn.Embedding, layer_norm_eps: float = 1e-12) -> None:
        super().__init__()
        self._word = [word]
        self.transform = nn.Sequential(
            nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width, eps=layer_norm_eps)
        )
        self.bias = nn.Parameter(torch.zeros(word.num_embeddings))
        init_weights(self.transform)

    def forward(self, h_MD: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(h_MD), self._word[0].weight, self.bias)  # [M,V]


def mlp_head(width: int, hidden: int, out: int, layer_norm_eps: float = 1e-12) -> nn.Sequential:
    """The task heads' classifier (UNITER's): Linear → GELU → LayerNorm → Linear to ``out``
    scores (state-dict names ``0.*``, ``2.*``, ``3.*``)."""
    return nn.Sequential(
        nn.Linear(width, hidden),
        nn.GELU(),
        nn.LayerNorm(hidden, eps=layer_norm_eps),
        nn.Linear(hidden, out),
    )


def token_loss(
    logits_MV: torch.Tensor, target_M: torch.Tensor, label_smoothing: float = 0.0
) -> dict[str, torch.Tensor]:
    """Mean cross-entropy over the M predicted positions and the accuracy; 0 (not NaN) when
    there is none."""
    n = max(target_M.numel(), 1)
    loss = (
        F.cross_entropy(
            logits_MV.float(), target_M, reduction="sum", label_smoothing=label_smoothing
        )
        / n
    )
    acc = (logits_MV.argmax(-1) == target_M).float().sum() / n
    return {"loss": loss, "acc": acc.detach()}
