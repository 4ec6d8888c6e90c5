"""Symmetric InfoNCE between two views (CLIP image↔text, or text↔text across languages).

Modality-agnostic: it compares ``pooled[a]`` with ``pooled[b]`` for the two names in
``modalities`` (``source: unimodal``: the vectors before any cross-modal layer, ALBEF's ITC
in a fusion model). With the same name twice (``[text, text]``) it aligns the two halves of
a stacked pair batch (``data.sources.<name>.pairs: stack``): rows i and B+i, each sentence
encoded alone, as InfoXLM's cross-lingual contrast. Learnable temperature (logit scale
initialised to 1/0.07, clamped at ``max_logit_scale``). Under torch.distributed the
features of all ranks are gathered with gradient; the default ``local_loss`` scores local
rows against all columns, so memory stays linear in the global batch (open_clip's
local-loss variant).
Legend: B local batch, N global batch, E embedding width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import init_weights
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

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        if len(cfg.modalities) != 2:
            raise ValueError(f"contrastive.modalities needs two names, got {cfg.modalities}")
        if cfg.source not in ("pooled", "unimodal"):
            raise ValueError(f"contrastive.source must be pooled or unimodal, got {cfg.source!r}")
        self.cfg = cfg
        dim = cfg.embed_dim or width
        self.proj = nn.ModuleDict({m: nn.Linear(width, dim, bias=False) for m in cfg.modalities})
        init = torch.tensor(math.log(1.0 / cfg.init_temperature))
        self.logit_scale = nn.Parameter(init, requires_grad=cfg.learn_temperature)
        init_weights(self.proj)

    def embed(self, out: FusionOutput, modality: str) -> torch.Tensor:
        """L2-normalised embedding [B,E] of one view, for retrieval."""
        if self.cfg.source == "unimodal":
            vector = out.unimodal_vector(modality)
        else:
            vector = out.pooled[modality]
        return F.normalize(self.proj[modality](vector).float(), dim=-1)

    def scale(self) -> torch.Tensor:
        """The current logit scale (1 / temperature), clamped."""
        return self.logit_scale.clamp(max=math.log(self.cfg.max_logit_scale)).exp()

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
        scale = self.scale()
        rank, world = _world()
        za_all = gather_features(za_BE, self.cfg.gather_with_grad)
        zb_all = gather_features(zb_BE, self.cfg.gather_with_grad)
        if self.cfg.local_loss or world == 1:
            loss = info_nce(
                za_BE, zb_BE, scale, za_all_NE=za_all, zb_all_NE=zb_all, offset=rank * len(za_BE)
            )
        else:
            loss = info_nce(za_all, zb_all, scale)
        with torch.no_grad():
            acc = (za_BE @ zb_BE.T).argmax(-1) == torch.arange(len(za_BE), device=za_BE.device)
        return {"loss": loss, "acc": acc.float().mean(), "logit_scale": scale.detach()}
