"""Sequence(-pair) classification: the task head of fine-tuning (XNLI, paraphrase tasks).

A task head is an objective like any other, so fine-tuning is pre-training's model and
trainer with another objective set and an ``init`` checkpoint. Reads ``labels [B]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need
from mmptm.objectives.base import Objective
from mmptm.registry import OBJECTIVES


@OBJECTIVES.register("classification")
class Classification(Objective):
    """Dropout + linear classifier on a pooled vector, cross-entropy on ``labels``."""

    @dataclass
    class Config:
        type: str = "classification"
        weight: float = 1.0
        num_labels: int = 3
        #: which pooled vector: ``joint`` (single/two stream) or a modality name
        pooled: str = "joint"
        dropout: float = 0.1

    def __init__(
        self, cfg: Config, *, width: int, widths: dict[str, int] | None = None, **_: object
    ) -> None:
        super().__init__()
        if cfg.num_labels < 2:
            raise ValueError(f"classification.num_labels must be >= 2, got {cfg.num_labels}")
        self.cfg = cfg
        in_width = (widths or {}).get(cfg.pooled, width)  # a dual tower of its own width
        self.head = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(in_width, cfg.num_labels))
        init_weights(self)

    def data_needs(self) -> dict[str, Need]:
        return {"label": Need("label")}

    def logits(self, out: FusionOutput) -> torch.Tensor:
        """Class logits [B,C]."""
        if self.cfg.pooled not in out.pooled:
            raise ValueError(
                f"classification.pooled={self.cfg.pooled!r} is not produced by this fusion "
                f"(has {sorted(out.pooled)})"
            )
        return self.head(out.pooled[self.cfg.pooled]).float()

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        if "labels" not in batch:
            raise KeyError("classification needs `labels` in the batch (e.g. NLI shards)")
        logits_BC = self.logits(out)
        labels_B = batch["labels"]
        loss = F.cross_entropy(logits_BC, labels_B)
        acc = (logits_BC.argmax(-1) == labels_B).float().mean()
        return {"loss": loss, "acc": acc.detach()}
