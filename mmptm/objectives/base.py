"""What every objective is: a data side (pure, seeded batch transform) and a loss side.

The data side runs in the data pipeline's workers on collated batches, with a
``torch.Generator`` seeded from (seed, epoch, rank, worker, batch index), so masking and
negatives are reproducible and a resumed run sees the same ones. The loss side is an
``nn.Module`` returning named tensors; names ending in ``_loss`` are summed by the model
with the recipe weight, the rest are metrics.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from mmptm.encoders.base import VocabInfo
from mmptm.fusion.base import FusionOutput

Batch = dict[str, torch.Tensor]


class BatchTransform(Protocol):
    """An objective's data side: a picklable callable over a collated batch.

    Transforms run in ascending ``data_priority``: negatives (10, they decide what is a
    positive pair), joining text pairs into one sequence (15), masking (20).
    """

    data_priority: int

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch: ...


class Objective(nn.Module):
    """Base class of the loss sides; subclasses register with ``OBJECTIVES``."""

    @classmethod
    def data_transform(cls, cfg, vocab: VocabInfo) -> BatchTransform | None:
        """The objective's data side for this config, or None when it needs none."""
        return None

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        raise NotImplementedError
