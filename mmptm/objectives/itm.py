"""Matching: is this pair aligned? Image-text matching (ITM), and with ``swap_keys:
[text2_*]`` Unicoder's cross-lingual paraphrase classification (aligned vs. misaligned
translations).

Data side: with probability ``prob_negative`` a sample's second side (the image, or the
second text view) is swapped for another sample's in the batch (never its own), giving
``itm_labels`` (1 = aligned). Loss side: a binary classifier on the fused ``pooled["joint"]``.
A batch with none of the swap keys (another source of a mixture) gets no loss from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.encoders.base import VocabInfo, init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.base import Batch, Objective
from mmptm.registry import OBJECTIVES


def sample_negatives(batch_size: int, prob: float, g: torch.Generator) -> torch.Tensor:
    """Index of the image each sample is paired with; i itself for positives."""
    idx_B = torch.arange(batch_size)
    if batch_size < 2:
        return idx_B
    neg_B = torch.rand(batch_size, generator=g) < prob
    shift_B = torch.randint(1, batch_size, (batch_size,), generator=g)  # never 0: not itself
    return torch.where(neg_B, (idx_B + shift_B) % batch_size, idx_B)


@dataclass
class SwapNegatives:
    """ITM data side: permutes the image-side keys of the negative samples."""

    data_priority: ClassVar[int] = 10

    prob: float
    keys: list[str]

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        explicit = [k for k in self.keys if not k.endswith("*")]
        prefixes = [k[:-1] for k in self.keys if k.endswith("*")]
        keys = [k for k in explicit if k in batch]
        keys += [b for b in batch if any(b.startswith(p) for p in prefixes) and b not in keys]
        if not keys:  # a batch of another source in a mixture: this objective sits it out
            return batch
        missing = [k for k in explicit if k not in batch]
        if missing:
            raise KeyError(f"itm.swap_keys {missing} are not in the batch (keys: {sorted(batch)})")
        partner_B = sample_negatives(batch[keys[0]].shape[0], self.prob, g)
        for k in keys:
            batch[k] = batch[k][partner_B]
        batch["itm_labels"] = (partner_B == torch.arange(len(partner_B))).long()
        return batch


@OBJECTIVES.register("itm")
class ImageTextMatching(Objective):
    """Binary matched / not-matched head on the joint pooled vector."""

    @dataclass
    class Config:
        type: str = "itm"
        weight: float = 1.0
        prob_negative: float = 0.5
        #: batch keys of the side that a negative swaps together; ``prefix*`` matches many
        swap_keys: list[str] = field(default_factory=lambda: ["pixels"])

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> SwapNegatives:
        if not 0.0 <= cfg.prob_negative <= 1.0:
            raise ValueError(f"itm.prob_negative must be in [0, 1], got {cfg.prob_negative}")
        return SwapNegatives(cfg.prob_negative, list(cfg.swap_keys))

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        self.cfg = cfg
        self.head = nn.Linear(width, 2)
        init_weights(self)

    def score(self, out: FusionOutput) -> torch.Tensor:
        """Matching logit margin [B] (higher = more likely a match), for retrieval."""
        logits_B2 = self.head(out.pooled["joint"]).float()
        return logits_B2[:, 1] - logits_B2[:, 0]

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        if "itm_labels" not in batch:  # inactive on this batch (see the data side)
            return {}
        if "joint" not in out.pooled:
            raise ValueError("itm needs a fusion module with cross-modal layers (pooled['joint'])")
        logits_B2 = self.head(out.pooled["joint"]).float()
        labels_B = batch["itm_labels"]
        loss = F.cross_entropy(logits_B2, labels_B)
        acc = (logits_B2.argmax(-1) == labels_B).float().mean()
        return {"loss": loss, "acc": acc.detach()}
