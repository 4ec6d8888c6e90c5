"""PretrainModel: encoders → fusion → objectives, composed from one ``ModelConfig``.

Every system in scope (CLIP, ViLT, VisualBERT, mBERT, ...) is a ``ModelConfig``; there is no
per-system code path. Downstream models reuse ``fuse`` with a task head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mmptm.batch import Batch, BatchTransform
from mmptm.encoders.base import ModalityTokens, VocabInfo
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need, merge_needs
from mmptm.models.resources import build_objective, objective_data_transform
from mmptm.objectives.base import ForObjectives, TaskSampler, task_objectives, trains
from mmptm.recipe import ModelConfig
from mmptm.registry import ENCODERS, FUSIONS


@dataclass
class PretrainOutput:
    """The weighted total loss and every named term (``<objective>_<name>``), detached."""

    loss: torch.Tensor
    terms: dict[str, torch.Tensor]


def data_transforms(cfg: ModelConfig, vocab: VocabInfo) -> list[BatchTransform]:
    """The objectives' data sides in the order they must run (negatives before masking).

    A shared data side (``shared = True``) asked for by several objectives runs once; with
    ``task_mix`` each one runs only on the batches of its objectives' tasks, with ``routes``
    only on the batches of the sources routed to its objectives.
    """
    groups: list[tuple[set[str], BatchTransform]] = []
    for name, c in cfg.objectives.items():
        t = objective_data_transform(c, vocab)
        if t is None:
            continue
        twin = next(
            (g for g in groups if getattr(t, "shared", False) and type(g[1]) is type(t)), None
        )
        if twin is None:
            groups.append(({name}, t))
        elif twin[1] != t:
            raise ValueError(
                f"objectives {sorted(twin[0])} and {name!r} share one {type(t).__name__} data "
                "side but configure it differently (e.g. mask_prob): make them agree"
            )
        else:
            twin[0].add(name)
    named = {"model.task_mix": [n for task in cfg.task_mix for n in task_objectives(task)]}
    named.update({f"model.routes.{src}": names for src, names in cfg.routes.items()})
    for key, names in named.items():
        unknown = set(names) - set(cfg.objectives)
        if unknown:
            raise ValueError(
                f"{key} names {sorted(unknown)}, not objectives ({sorted(cfg.objectives)})"
            )
    transforms: list[BatchTransform] = [t for _, t in groups]
    if cfg.task_mix or cfg.routes:
        routes = {src: tuple(names) for src, names in cfg.routes.items()}
        transforms = [ForObjectives(frozenset(names), routes, t) for names, t in groups]
    if cfg.task_mix:
        transforms.append(TaskSampler(dict(cfg.task_mix)))
    return sorted(transforms, key=lambda t: t.data_priority)


def view_widths(cfg: ModelConfig) -> dict[str, int]:
    """Each encoder's width: ``model.widths`` where it names one, else ``model.width``."""
    unknown = sorted(set(cfg.widths) - set(cfg.encoders))
    if unknown:
        raise ValueError(f"model.widths names {unknown}, not encoders ({sorted(cfg.encoders)})")
    bad = {n: w for n, w in cfg.widths.items() if not (isinstance(w, int) and w > 0)}
    if bad:
        raise ValueError(f"model.widths must be positive integers, got {bad}")
    own = {n: w for n, w in cfg.widths.items() if w != cfg.width}
    if own and not FUSIONS.get(cfg.fusion.type).per_view_widths:
        raise ValueError(
            f"model.widths {own}: fusion {cfg.fusion.type!r} mixes the modalities, so every "
            f"encoder must come at model.width={cfg.width} (own widths need fusion: dual)"
        )
    return {n: cfg.widths.get(n, cfg.width) for n in cfg.encoders}


class PretrainModel(nn.Module):
    """Runs the encoders whose inputs are in the batch, fuses them, applies the objectives."""

    def __init__(self, cfg: ModelConfig, vocab: VocabInfo) -> None:
        super().__init__()
        if not cfg.encoders:
            raise ValueError("model.encoders is empty: a model needs at least one encoder")
        self.cfg = cfg
        widths = view_widths(cfg)
        self.encoders = nn.ModuleDict()
        for name, c in cfg.encoders.items():  # in order: a later encoder may tie to an earlier
            self.encoders[name] = ENCODERS.build(
                c, width=widths[name], vocab=vocab, name=name, built=dict(self.encoders)
            )
        self.fusion = FUSIONS.build(
            cfg.fusion,
            width=cfg.width,
            modalities=list(cfg.encoders),
            widths=widths,
            encoders=self.encoders,
        )
        self.objectives = nn.ModuleDict(
            {  # each with the resources its config names (a teacher run, an answer list)
                name: build_objective(
                    c,
                    width=cfg.width,
                    widths=widths,
                    encoders=self.encoders,
                    fusion=self.fusion,
                    vocab=vocab,
                )
                for name, c in cfg.objectives.items()
            }
        )
        for objective in self.objectives.values():  # objectives that read another one
            if hasattr(objective, "bind"):
                objective.bind(self.objectives)
        self.weights = {name: c.weight for name, c in cfg.objectives.items()}
        #: the objectives of ``model.starts`` whose start training has not reached (the
        #: trainer sets it when it changes; empty outside training: every objective trains)
        self.waiting: frozenset[str] = frozenset()

    def data_needs(self) -> dict[str, Need]:
        """Every view the model reads, merged from its encoders, fusion and objectives."""
        declared = [(f"model.encoders.{n}", e.data_needs()) for n, e in self.encoders.items()]
        declared.append(("model.fusion", self.fusion.data_needs()))
        declared += [(f"model.objectives.{n}", o.data_needs()) for n, o in self.objectives.items()]
        return merge_needs(declared)

    def fuse(self, batch: Batch) -> FusionOutput:
        """Encode every modality present in the batch and fuse them.

        Records the encoder tokens (``encoded``) and, where the fusion module gives none,
        a ``repair`` that re-runs the fusion on re-indexed encoder tokens.
        """
        tokens = {m: enc(batch) for m, enc in self.encoders.items() if enc.has_input(batch)}
        if not tokens:
            wanted = {m: enc.input_key for m, enc in self.encoders.items()}
            raise KeyError(f"the batch has no encoder input (wanted one of {wanted})")
        out = self.fusion(tokens, batch)
        out.encoded = tokens
        if out.repair is None:
            out.repair = lambda rows: self.fusion(
                {m: ModalityTokens(t.tokens[rows[m]], t.mask[rows[m]]) for m, t in tokens.items()}
            )
        return out

    def forward(self, batch: Batch) -> PretrainOutput:
        out = self.fuse(batch)
        total = None
        terms: dict[str, torch.Tensor] = {}
        for name, objective in self.objectives.items():
            if not trains(batch, name, self.cfg.routes):  # task_mix / routes
                continue
            if name in self.waiting:  # model.starts: not started yet
                continue
            for key, value in objective(out, batch).items():
                terms[f"{name}_{key}"] = value.detach()
                if key.endswith("loss"):
                    weighted = self.weights[name] * value
                    total = weighted if total is None else total + weighted
        if total is None:
            raise ValueError("no objective returned a loss: add one under model.objectives")
        return PretrainOutput(total, terms)
