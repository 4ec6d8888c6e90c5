"""ERNIE's denoising entity auto-encoder (dEA): recover each token's aligned entity.

Data side (:class:`DenoiseEntities`): every batch key of entity ids aligned to tokens
(``entity_ids`` of the text plug-in's spans, ``region_entity_ids`` of the regions plug-in,
any view prefix) is a set of token–entity alignments. As ERNIE, for ``replace_prob`` (5 %)
of the alignments the input entity is replaced by another entity of the batch, for
``mask_prob`` (15 %) it is removed (-1: the token fuses no entity), the rest are kept; the
original entity of every alignment is the target (``<key>`` with ``_ids`` → ``_labels``,
-1 where none).

Loss side: at every aligned position the final token state is mapped to the entity width
(Linear, GELU, LayerNorm: ERNIE's entity prediction head) and scored by a dot product
against the entity vectors of the batch's distinct target entities; the loss is the cross
entropy of the softmax over that set (ERNIE predicts among the batch's entities, not the
whole graph). The entity vectors are the fusion's entity table (``fusion: ernie``), so its
``knowledge: false`` switches dEA off too.

Legend: B batch, N tokens, D width, K entity width, M aligned positions, C candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import VocabInfo, init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.base import Objective
from mmptm.registry import OBJECTIVES

#: batch keys of entity ids aligned to a view's tokens end with this
ENTITY_SUFFIX = "entity_ids"


def label_key(key: str) -> str:
    """The target key of an entity-id key: ``entity_ids`` → ``entity_labels``."""
    return key[: -len("_ids")] + "_labels"


def denoise_entities(
    ids: list[torch.Tensor], g: torch.Generator, *, replace_prob: float, mask_prob: float
) -> list[torch.Tensor]:
    """dEA's noise on aligned entity ids (-1 = none), each tensor any shape: per alignment,
    with ``replace_prob`` another of the entities present (a different one when there is
    one), with ``mask_prob`` -1, else kept. Returns the noisy ids, in order."""
    pool_P = torch.unique(torch.cat([t[t >= 0] for t in ids]))
    out = []
    for ids_X in ids:
        aligned_X = ids_X >= 0
        r_X = torch.rand(ids_X.shape, generator=g)
        replace_X = aligned_X & (r_X < replace_prob)
        drop_X = aligned_X & (r_X >= replace_prob) & (r_X < replace_prob + mask_prob)
        noisy_X = ids_X.clone()
        if len(pool_P) > 1:
            # a uniform draw among the other P - 1 entities: skip over the true one's slot
            own_X = torch.searchsorted(pool_P, ids_X.clamp_min(0))
            j_X = torch.randint(len(pool_P) - 1, ids_X.shape, generator=g)
            j_X = j_X + (j_X >= own_X).long()
            noisy_X = torch.where(replace_X, pool_P[j_X], noisy_X)
        out.append(noisy_X.masked_fill(drop_X, -1))
    return out


@dataclass
class DenoiseEntities:
    """dEA's data side over every ``*entity_ids`` key of the batch; writes ``*entity_labels``."""

    data_priority: ClassVar[int] = 20  # after negatives (10) and pair packing (15)

    replace_prob: float
    mask_prob: float

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        keys = sorted(k for k in batch if k.endswith(ENTITY_SUFFIX))
        ids = [batch[k] for k in keys]
        if not ids or not any((t >= 0).any() for t in ids):
            return batch
        noisy = denoise_entities(ids, g, replace_prob=self.replace_prob, mask_prob=self.mask_prob)
        for k, original, new in zip(keys, ids, noisy):
            batch[label_key(k)] = original
            batch[k] = new
        return batch


@OBJECTIVES.register("dea")
class DenoisingEntityAutoEncoder(Objective):
    """Predicts each aligned token's entity among the batch's entities (module docstring)."""

    @dataclass
    class Config:
        type: str = "dea"
        weight: float = 1.0
        #: share of alignments whose input entity is replaced by another (ERNIE: 5 %)
        replace_prob: float = 0.05
        #: share of alignments whose input entity is removed (ERNIE: 15 %)
        mask_prob: float = 0.15
        layer_norm_eps: float = 1e-12

        def __post_init__(self) -> None:
            if not (0 <= self.replace_prob and 0 <= self.mask_prob) or (
                self.replace_prob + self.mask_prob > 1
            ):
                raise ValueError(
                    "dea.replace_prob and dea.mask_prob must be >= 0 with a sum <= 1, got "
                    f"{self.replace_prob} and {self.mask_prob}"
                )

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> DenoiseEntities:
        return DenoiseEntities(cfg.replace_prob, cfg.mask_prob)

    def __init__(self, cfg: Config, *, width: int, fusion: nn.Module, **_: object) -> None:
        super().__init__()
        self.cfg = cfg
        table = getattr(fusion, "entities", None)
        keys = getattr(fusion, "entity_keys", None)
        if table is None or keys is None:
            raise ValueError(
                f"dea predicts entities of the fusion's entity table; fusion "
                f"{type(fusion).__name__} has none (use fusion: ernie)"
            )
        # A tuple keeps the fusion's modules out of this one (they are the fusion's).
        self._fusion = (fusion,)
        dim = fusion.cfg.entity_dim
        self.transform = nn.Sequential(
            nn.Linear(width, dim), nn.GELU(), nn.LayerNorm(dim, eps=cfg.layer_norm_eps)
        )
        init_weights(self.transform)

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        (fusion,) = self._fusion
        if not fusion.cfg.knowledge:
            return {}
        states, targets = [], []
        for view, (_, key) in fusion.entity_keys.items():
            labels = batch.get(label_key(key))
            if labels is None or view not in out.hidden:
                continue
            sel = labels >= 0
            states.append(out.hidden[view][sel])
            targets.append(labels[sel])
        if not targets or sum(len(t) for t in targets) == 0:
            return {}  # no alignment in this batch
        h_MD, target_M = torch.cat(states), torch.cat(targets)
        cands_C = torch.unique(target_M)
        e_CK = fusion.entities.rows(cands_C).to(h_MD.dtype)
        logits_MC = self.transform(h_MD) @ e_CK.T
        index_M = torch.searchsorted(cands_C, target_M)
        loss = F.cross_entropy(logits_MC.float(), index_M)
        acc = (logits_MC.argmax(-1) == index_M).float().mean()
        return {"loss": loss, "acc": acc.detach(), "candidates": torch.tensor(float(len(cands_C)))}
