"""What every objective is: a data side (pure, seeded batch transform) and a loss side.

The data side runs in the data pipeline's workers on collated batches, with a
``torch.Generator`` seeded from (seed, epoch, rank, worker, batch index), so masking and
negatives are reproducible and a resumed run sees the same ones. The loss side is an
``nn.Module`` returning named tensors; names ending in ``_loss`` are summed by the model
with the recipe weight, the rest are metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from mmptm.batch import TASK, Batch, BatchTransform, batch_source
from mmptm.encoders.base import VocabInfo
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need


class Objective(nn.Module):
    """Base class of the loss sides; subclasses register with ``OBJECTIVES``."""

    #: whether its loss is a sum over tokens that may train on packed rows (several samples
    #: per row: ``data.sources.<name>.pack``); a loss over rows or pooled vectors may not
    token_level: ClassVar[bool] = False

    @classmethod
    def data_transform(cls, cfg, vocab: VocabInfo) -> BatchTransform | None:
        """The objective's data side for this config, or None when it needs none."""
        return None

    def data_needs(self) -> dict[str, Need]:
        """Data this objective reads besides what the encoders read (targets; default none)."""
        return {}

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def after_step(self) -> None:
        """Called by the trainer after each optimiser step: constraints on parameters (a
        clamped temperature) belong here, not in ``forward``, where a clamp blocks the
        gradient."""


def encoder_target_dim(enc: nn.Module, configured: int, where: str) -> int:
    """Width F of an encoder's ``ModalityTokens.targets``: ``configured`` when set, else the
    encoder's ``target_dim`` attribute (else its config's ``conv_dim``: the wav2vec 2.0
    layout's targets are its conv features); an error naming ``where`` when none is known."""
    dim = configured or int(getattr(enc, "target_dim", 0) or 0)
    if not dim:
        dim = int(getattr(getattr(enc, "cfg", None), "conv_dim", 0) or 0)
    if dim < 1:
        raise ValueError(
            f"{where}: the encoder does not give the width of its targets (no target_dim "
            "attribute); set target_dim"
        )
    return dim


@dataclass
class TaskSampler:
    """Per-step task sampling (UNITER): each batch trains one objective, drawn by weight.

    Writes ``batch["__task__"]``; the model then computes that objective alone, and only its
    data side runs (see :class:`ForObjectives`) — which is UNITER's conditional masking: an MLM
    batch keeps its regions whole, a region-modelling batch keeps its text whole.
    """

    data_priority: ClassVar[int] = 0

    weights: dict[str, float]

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        names = list(self.weights)
        w = torch.tensor([self.weights[n] for n in names], dtype=torch.float)
        batch[TASK] = names[int(torch.multinomial(w, 1, generator=g))]
        return batch


def trains(batch: Batch, objective: str, routes: dict) -> bool:
    """Whether ``objective`` trains on this batch: the sampled task (``task_mix``), if any,
    is that objective, and ``routes`` (source → objectives) lets the batch's source train it."""
    task = batch.get(TASK)
    if task is not None and task != objective:
        return False
    source = batch_source(batch)
    return source not in routes or objective in routes[source]


@dataclass
class ForObjectives:
    """Runs a data side only on batches that train one of ``objectives`` (see :func:`trains`)."""

    objectives: frozenset[str]
    routes: dict[str, tuple[str, ...]]
    inner: BatchTransform

    @property
    def data_priority(self) -> int:
        return self.inner.data_priority

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        if any(trains(batch, name, self.routes) for name in self.objectives):
            return self.inner(batch, g)
        return batch
