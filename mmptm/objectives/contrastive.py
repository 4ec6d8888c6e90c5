"""Symmetric InfoNCE between two views (CLIP image↔text, or text↔text across languages).

Modality-agnostic: it compares ``pooled[a]`` with ``pooled[b]`` for the two names in
``modalities`` (``source: unimodal``: the vectors before any cross-modal layer, ALBEF's ITC
in a fusion model). With the same name twice (``[text, text]``) it aligns the two halves of
a stacked pair batch (``data.sources.<name>.pairs: stack``): rows i and B+i, each sentence
encoded alone, as InfoXLM's cross-lingual contrast. Learnable temperature (logit scale
initialised to 1/0.07; as open_clip, the parameter is clamped to [0, ln ``max_logit_scale``]
after each optimiser step, so that above the bound it keeps its gradient and comes back).
Under torch.distributed the features of all ranks are gathered with gradient; the default
``local_loss`` scores local rows against all columns, so memory stays linear in the global
batch (open_clip's local-loss variant).

``time_reversed_keys`` (e.g. ``[frames, frames_mask]``) adds **time-reversed negatives**
(as TACT, Bagad et al. 2023, "Test of Time"): the data side appends, for a share
``time_reversed_prob`` of the clips with at least two real steps, a copy played backwards
(the real steps of every listed [B,T,...] tensor in reverse order; the one ``*_mask`` key
gives the lengths). The loss scores each caption against them as extra negatives, so the
caption of a clip must prefer the clip to the same frames in reverse order: in-batch
negatives alone almost never differ in order only, and a model trained with them ignores
time. ``time_reversed_weight`` adds a two-way loss on top (TACT's time-order loss): each
caption must pick its clip over the reversed copy, ``reversal_loss`` = cross-entropy over
the two scores. ``time_reversed_rows`` [k] holds which rows were copied; only a dual encoder
(modalities encoded apart) accepts the unequal row counts.
Legend: B local batch, N global batch, E embedding width, T steps, k reversed copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import VocabInfo, init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.base import Objective
from mmptm.registry import OBJECTIVES


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_features(z_BE: torch.Tensor, with_grad: bool = True) -> torch.Tensor:
    """All ranks' features [N,E] in rank order; gradients flow back to each rank's own rows."""
    rank, world = _world()
    if world == 1:
        return z_BE
    if with_grad:
        import torch.distributed.nn.functional as dist_fn

        return torch.cat(dist_fn.all_gather(z_BE), dim=0)
    parts = [torch.zeros_like(z_BE) for _ in range(world)]
    dist.all_gather(parts, z_BE)
    parts[rank] = z_BE  # keep the local gradient path
    return torch.cat(parts, dim=0)


def info_nce(
    za_BE: torch.Tensor,
    zb_BE: torch.Tensor,
    logit_scale: torch.Tensor,
    *,
    za_all_NE: torch.Tensor | None = None,
    zb_all_NE: torch.Tensor | None = None,
    offset: int = 0,
) -> torch.Tensor:
    """Symmetric cross-entropy of local rows against all columns; row i matches column offset+i."""
    za_all_NE = za_BE if za_all_NE is None else za_all_NE
    zb_all_NE = zb_BE if zb_all_NE is None else zb_all_NE
    target_B = torch.arange(za_BE.shape[0], device=za_BE.device) + offset
    logits_ab_BN = logit_scale * za_BE @ zb_all_NE.T
    logits_ba_BN = logit_scale * zb_BE @ za_all_NE.T
    return 0.5 * (F.cross_entropy(logits_ab_BN, target_B) + F.cross_entropy(logits_ba_BN, target_B))


#: the batch key listing which rows have a time-reversed copy appended
REVERSED_ROWS = "time_reversed_rows"


@dataclass
class TimeReversed:
    """Data side of time-reversed negatives: appends reversed copies of some clips' steps."""

    data_priority: ClassVar[int] = 30  # after masking and ITM: copies of what the model sees

    keys: list[str]
    prob: float

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        masks = [k for k in self.keys if k.endswith("_mask")]
        if len(masks) != 1:
            raise ValueError(
                f"contrastive.time_reversed_keys {self.keys} need exactly one *_mask key"
            )
        if masks[0] not in batch:  # a batch of another source of a mixture
            return batch
        missing = [k for k in self.keys if k not in batch]
        if missing:
            raise KeyError(f"contrastive.time_reversed_keys {missing} are not in the batch")
        lengths_B = batch[masks[0]].sum(1)
        chosen_B = (lengths_B >= 2) & (torch.rand(len(lengths_B), generator=g) < self.prob)
        rows_K = chosen_B.nonzero().flatten()
        T = batch[masks[0]].shape[1]
        t_KT = torch.arange(T)[None].expand(len(rows_K), T)
        length_K1 = lengths_B[rows_K][:, None]
        # step t of a copy is step L-1-t of the original; padding steps stay where they are
        src_KT = torch.where(t_KT < length_K1, length_K1 - 1 - t_KT, t_KT)
        for k in self.keys:
            x = batch[k]
            index = src_KT.view(*src_KT.shape, *([1] * (x.ndim - 2))).expand(-1, -1, *x.shape[2:])
            batch[k] = torch.cat([x, x[rows_K].gather(1, index)])
        batch[REVERSED_ROWS] = rows_K
        return batch


@OBJECTIVES.register("contrastive")
class Contrastive(Objective):
    """Projection heads per view + symmetric InfoNCE with a learnable temperature."""

    @dataclass
    class Config:
        type: str = "contrastive"
        weight: float = 1.0
        #: the two pooled views to align, e.g. [image, text] or [text, text2]; the same name
        #: twice aligns the halves of stacked pair batches
        modalities: list[str] = field(default_factory=lambda: ["image", "text"])
        #: projection width (0 = the fusion width)
        embed_dim: int = 0
        init_temperature: float = 0.07
        max_logit_scale: float = 100.0
        learn_temperature: bool = True
        local_loss: bool = True
        gather_with_grad: bool = True
        #: which vectors to align: ``pooled`` (the fusion's output; dual encoders) or
        #: ``unimodal`` (before cross-modal layers: ITC ahead of a fusion, as ALBEF)
        source: str = "pooled"
        #: time-reversed negatives for the first view (module docstring): its [B,T,...]
        #: keys, e.g. [frames, frames_mask]; [] = none
        time_reversed_keys: list[str] = field(default_factory=list)
        #: share of the clips (with >= 2 steps) that get a reversed copy
        time_reversed_prob: float = 0.5
        #: weight of the two-way loss: each caption picks its clip over the reversed copy
        time_reversed_weight: float = 1.0

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> TimeReversed | None:
        if not cfg.time_reversed_keys:
            return None
        if not 0.0 < cfg.time_reversed_prob <= 1.0:
            raise ValueError(
                f"contrastive.time_reversed_prob must be in (0, 1], got {cfg.time_reversed_prob}"
            )
        return TimeReversed(list(cfg.time_reversed_keys), cfg.time_reversed_prob)

    def __init__(
        self, cfg: Config, *, width: int, widths: dict[str, int] | None = None, **_: object
    ) -> None:
        super().__init__()
        if len(cfg.modalities) != 2:
            raise ValueError(f"contrastive.modalities needs two names, got {cfg.modalities}")
        if cfg.source not in ("pooled", "unimodal"):
            raise ValueError(f"contrastive.source must be pooled or unimodal, got {cfg.source!r}")
        self.cfg = cfg
        dim = cfg.embed_dim or width
        # Each view is projected from its own width (model.widths: dual towers of their own).
        self.proj = nn.ModuleDict(
            {m: nn.Linear((widths or {}).get(m, width), dim, bias=False) for m in cfg.modalities}
        )
        init = torch.tensor(math.log(1.0 / cfg.init_temperature))
        self.logit_scale = nn.Parameter(init, requires_grad=cfg.learn_temperature)
        init_weights(self.proj)

    @property
    def views(self) -> tuple[str, str]:
        """The two views it aligns (``modalities``)."""
        a, b = self.cfg.modalities
        return a, b

    def embed(self, out: FusionOutput, modality: str) -> torch.Tensor:
        """L2-normalised embedding [B,E] of one view, for retrieval."""
        if self.cfg.source == "unimodal":
            vector = out.unimodal_vector(modality)
        else:
            vector = out.pooled[modality]
        return F.normalize(self.proj[modality](vector).float(), dim=-1)

    def scale(self) -> torch.Tensor:
        """The current logit scale (1 / temperature)."""
        return self.logit_scale.exp()

    @torch.no_grad()
    def after_step(self) -> None:
        self.logit_scale.clamp_(0.0, math.log(self.cfg.max_logit_scale))

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        a, b = self.cfg.modalities
        if a == b:  # stacked pairs: rows i and B+i
            if batch.get("__pairs__") != "stacked":
                raise ValueError(
                    f"contrastive.modalities [{a}, {a}] aligns stacked pairs, but this batch "
                    f"(source {batch.get('__source__')!r}) has none: set pairs: stack on its "
                    "data source, or route the source to other objectives (model.routes)"
                )
            za_BE, zb_BE = self.embed(out, a).chunk(2)
        else:
            za_BE, zb_BE = self.embed(out, a), self.embed(out, b)
        reversed_KE = za_BE[len(zb_BE) :]  # time-reversed copies of some clips (data side)
        za_BE = za_BE[: len(zb_BE)]
        scale = self.scale()
        rank, world = _world()
        za_all = gather_features(za_BE, self.cfg.gather_with_grad)
        zb_all = gather_features(zb_BE, self.cfg.gather_with_grad)
        if len(reversed_KE):  # extra columns for b → a: this rank's reversed clips
            za_all = torch.cat([za_all, reversed_KE])
        if self.cfg.local_loss or world == 1 or len(reversed_KE):
            loss = info_nce(
                za_BE, zb_BE, scale, za_all_NE=za_all, zb_all_NE=zb_all, offset=rank * len(za_BE)
            )
        else:
            loss = info_nce(za_all, zb_all, scale)
        with torch.no_grad():
            acc = (za_BE @ zb_BE.T).argmax(-1) == torch.arange(len(za_BE), device=za_BE.device)
        terms = {"loss": loss, "acc": acc.float().mean(), "logit_scale": scale.detach()}
        if len(reversed_KE):  # each caption: its clip (column 0) or the reversed copy
            rows_K = batch[REVERSED_ROWS].to(zb_BE.device)
            text_KE = zb_BE[rows_K]
            own_K = (text_KE * za_BE[rows_K]).sum(-1)
            two_K2 = torch.stack([own_K, (text_KE * reversed_KE).sum(-1)], 1)
            target_K = torch.zeros(len(rows_K), dtype=torch.long, device=two_K2.device)
            terms["reversal_loss"] = self.cfg.time_reversed_weight * F.cross_entropy(
                scale * two_K2, target_K
            )
            terms["reversal_acc"] = (two_K2[:, 0] > two_K2[:, 1]).float().mean().detach()
        return terms
