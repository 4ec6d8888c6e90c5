"""What every objective is: a data side (pure, seeded batch transform) and a loss side.

The data side runs in the data pipeline's workers on collated batches, with a
``torch.Generator`` seeded from (seed, epoch, rank, worker, batch index), so masking and
negatives are reproducible and a resumed run sees the same ones. The loss side is an
``nn.Module`` returning named tensors; names ending in ``_loss`` are summed by the model
with the recipe weight, the rest are metrics.

What a config names on disk in a format owned above the objectives (an earlier run's
checkpoint) or by data preparation (an answer list, an aliases file), an objective declares as
:class:`Resource`s, which ``mmptm.models`` loads and hands over: objectives never open a
checkpoint. (Formats a lower floor owns, such as a codebook or a label list, are read through
their owner's reader.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from mmptm.batch import TASK, Batch, BatchTransform, batch_source
from mmptm.encoders.base import VocabInfo
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need


@dataclass(frozen=True)
class Resource:
    """A file or run an objective's config names: ``mmptm.models`` loads it and hands the
    result to the objective's constructor as a keyword argument (and to its
    ``data_transform`` too, with ``data_side``)."""

    #: the config key that names it (for errors), e.g. ``vqa.answers``
    key: str
    path: str
    #: the data side needs it as well (an answer vocabulary for the soft targets)
    data_side: bool = False


@dataclass(frozen=True)
class Lines(Resource):
    """A text file's non-empty lines, in order: ``list[str]`` (an answer vocabulary)."""


@dataclass(frozen=True)
class Aliases(Resource):
    """A knowledge graph's aliases file (``id<TAB>alias...``): ``{entity id: [alias, ...]}``."""


@dataclass(frozen=True)
class RunEncoder(Resource):
    """An encoder of an earlier run (a checkpoint, or a run dir's newest, sharded or not),
    built from the run's saved config and loaded with its weights, frozen, in eval mode.

    It is the run's encoder ``view``, else the one named ``name``, else its only encoder of
    ``modality``; built here under ``name`` (the batch keys it reads)."""

    modality: str = ""
    view: str = ""
    name: str = ""


class Objective(nn.Module):
    """Base class of the loss sides; subclasses register with ``OBJECTIVES``."""

    #: whether its loss is a sum over tokens that may train on packed rows (several samples
    #: per row: ``data.sources.<name>.pack``); a loss over rows or pooled vectors may not
    token_level: ClassVar[bool] = False

    @classmethod
    def resources(cls, cfg) -> dict[str, Resource]:
        """What this config names on disk, by the keyword argument it is handed as (loaded
        by ``mmptm.models``; default none)."""
        return {}

    @classmethod
    def data_transform(cls, cfg, vocab: VocabInfo, **resources: Any) -> BatchTransform | None:
        """The objective's data side for this config, or None when it needs none
        (``resources``: the loaded ones declared with ``data_side``)."""
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


@runtime_checkable
class PairSimilarity(Protocol):
    """An objective that embeds two views to compare them (contrastive): what ITM's hard
    negatives are drawn by, found among the model's objectives without naming its class."""

    @property
    def views(self) -> tuple[str, str]:
        """The two views it aligns."""
        ...

    def embed(self, out: FusionOutput, view: str) -> torch.Tensor:
        """L2-normalised embedding [B,E] of one view."""
        ...

    def scale(self) -> torch.Tensor:
        """The logit scale (1 / temperature)."""
        ...


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

    Writes ``batch["__task__"]``; the model then computes that objective alone (or the
    objectives a ``+`` joins: :func:`task_objectives`), and only its data side runs (see
    :class:`ForObjectives`) — which is UNITER's conditional masking: an MLM batch keeps its
    regions whole, a region-modelling batch keeps its text whole.
    """

    data_priority: ClassVar[int] = 0

    weights: dict[str, float]

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        names = list(self.weights)
        w = torch.tensor([self.weights[n] for n in names], dtype=torch.float)
        batch[TASK] = names[int(torch.multinomial(w, 1, generator=g))]
        return batch


def task_objectives(task: str) -> list[str]:
    """The objectives a ``task_mix`` task trains: one, or several joined by ``+``."""
    return task.split("+")


def trains(batch: Batch, objective: str, routes: dict) -> bool:
    """Whether ``objective`` trains on this batch: the sampled task (``task_mix``), if any,
    is that objective or a group naming it (``itm+wra``: UNITER's OT loss on ITM's batches),
    and ``routes`` (source → objectives) lets the batch's source train it."""
    task = batch.get(TASK)
    if task is not None and objective not in task_objectives(task):
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
