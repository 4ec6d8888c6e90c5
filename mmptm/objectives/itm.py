"""Matching: is this pair aligned? Image-text matching (ITM), and with ``swap_keys:
[text2_*]`` Unicoder's cross-lingual paraphrase classification (aligned vs. misaligned
translations) and, on a text view with object tags, Oscar's contrastive loss (polluted tags:
the tag segment swapped for another sample's, classified polluted or not).

Data side: with probability ``prob_negative`` a sample's second side (the image, or the
second text view) is swapped for another sample's in the batch (never its own), giving
``itm_labels`` (1 = aligned). Loss side: a binary classifier on the fused ``pooled["joint"]``.
A batch with none of the swap keys (another source of a mixture) gets no loss from it.

``negatives: overlap``: the same swaps, but a negative sample's partner is the other sample
of the batch whose text shares the most pieces with its own (Jaccard over the sets of
non-special pieces of ``overlap_key``; a text with exactly the same pieces is never taken):
the image of a caption that differs in one word or two, which random in-batch negatives
rarely give and which ranking needs (UNITER and VILLA mine such negatives with the model;
this costs no forward pass).

``negatives: hard`` (ALBEF): no data side; every sample is a positive, and for each one a
negative partner on each side is drawn with probability ∝ softmax of the ``similarity``
contrastive objective's scores (its own partner excluded), so negatives are the pairs the
contrastive stage confuses. The 2B negative pairs are fused again from the encoded batch
(``FusionOutput.repair``, no re-encoding): B positives to 2B negatives, as ALBEF. Negatives
come from the local batch (ALBEF gathers them across ranks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import SWAPPED, Batch
from mmptm.encoders.base import VocabInfo, init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.base import Objective, PairSimilarity
from mmptm.registry import OBJECTIVES


def sample_negatives(batch_size: int, prob: float, g: torch.Generator) -> torch.Tensor:
    """Index of the image each sample is paired with; i itself for positives."""
    idx_B = torch.arange(batch_size)
    if batch_size < 2:
        return idx_B
    neg_B = torch.rand(batch_size, generator=g) < prob
    shift_B = torch.randint(1, batch_size, (batch_size,), generator=g)  # never 0: not itself
    return torch.where(neg_B, (idx_B + shift_B) % batch_size, idx_B)


def overlap_partners(
    ids_BL: torch.Tensor, real_BL: torch.Tensor, special: torch.Tensor, g: torch.Generator
) -> torch.Tensor:
    """Per row, the other row whose piece set overlaps its own most (Jaccard; ties drawn
    from ``g``); rows with the same set, or none else: a random other row."""
    B = ids_BL.shape[0]
    keep_BL = real_BL.bool() & ~torch.isin(ids_BL, special)
    V = int(ids_BL.max()) + 1
    bag_BV = torch.zeros(B, V)
    bag_BV[torch.arange(B)[:, None].expand_as(ids_BL)[keep_BL], ids_BL[keep_BL]] = 1.0
    inter_BB = bag_BV @ bag_BV.T
    size_B = bag_BV.sum(1)
    jac_BB = inter_BB / (size_B[:, None] + size_B[None, :] - inter_BB).clamp(min=1)
    jac_BB[(jac_BB >= 1.0) | torch.eye(B, dtype=torch.bool)] = -1.0
    jac_BB += 1e-6 * torch.rand(B, B, generator=g)  # ties: a random one of the best
    best_B = jac_BB.argmax(1)
    random_B = (torch.arange(B) + torch.randint(1, max(B, 2), (B,), generator=g)) % B
    return torch.where(jac_BB.max(1).values > 0, best_B, random_B)


@dataclass
class SwapNegatives:
    """ITM data side: permutes the image-side keys of the negative samples."""

    data_priority: ClassVar[int] = 10

    prob: float
    keys: list[str]
    #: overlap negatives (module doc): the key whose piece sets pick the partner, and the
    #: special ids left out of them; empty = random partners
    overlap_key: str = ""
    special_ids: tuple[int, ...] = ()
    #: the share of negatives that take the closest caption's image (the rest: random)
    overlap_share: float = 0.5

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
        if self.overlap_key and len(partner_B) > 1:
            if self.overlap_key not in batch:
                raise KeyError(f"itm.overlap_key {self.overlap_key!r} is not in the batch")
            ids_BL = batch[self.overlap_key]
            real_BL = batch.get(_mask_key(self.overlap_key), torch.ones_like(ids_BL))
            special = torch.tensor(self.special_ids, dtype=ids_BL.dtype)
            close_B = overlap_partners(ids_BL, real_BL, special, g)
            negative_B = partner_B != torch.arange(len(partner_B))
            hard_B = negative_B & (torch.rand(len(partner_B), generator=g) < self.overlap_share)
            partner_B = torch.where(hard_B, close_B, partner_B)
        for k in keys:
            batch[k] = batch[k][partner_B]
        batch["itm_labels"] = (partner_B == torch.arange(len(partner_B))).long()
        batch[SWAPPED] = keys
        return batch


def _mask_key(ids_key: str) -> str:
    """``input_ids`` → ``attention_mask``, ``text2_input_ids`` → ``text2_attention_mask``."""
    return ids_key.removesuffix("input_ids") + "attention_mask"


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
        #: random: in-batch swaps on the data side; overlap: swaps with the sample whose
        #: text shares most pieces (module doc); hard: ALBEF's similarity-sampled negatives
        negatives: str = "random"
        #: overlap negatives: the text whose pieces are compared (the side not swapped), and
        #: the share of negatives that are overlap ones (the rest stay random: from hard ones
        #: alone ITM learns nothing in 1000 steps on toyworld, docs/results/vision-language.md)
        overlap_key: str = "input_ids"
        overlap_share: float = 0.5
        #: hard negatives: the name of the contrastive objective whose scores rank them
        similarity: str = ""

        def __post_init__(self) -> None:
            if self.negatives not in ("random", "overlap", "hard"):
                raise ValueError(
                    f"itm.negatives must be random, overlap or hard, got {self.negatives!r}"
                )
            if not 0.0 <= self.overlap_share <= 1.0:
                raise ValueError(f"itm.overlap_share must be in [0, 1], got {self.overlap_share}")
            if not 0.0 <= self.prob_negative <= 1.0:
                raise ValueError(f"itm.prob_negative must be in [0, 1], got {self.prob_negative}")

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> SwapNegatives | None:
        if cfg.negatives == "hard":
            return None
        if cfg.negatives == "overlap":
            specials = tuple(sorted(vocab.special_ids))
            return SwapNegatives(
                cfg.prob_negative, list(cfg.swap_keys), cfg.overlap_key, specials,
                cfg.overlap_share,
            )  # fmt: skip
        return SwapNegatives(cfg.prob_negative, list(cfg.swap_keys))

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        self.cfg = cfg
        self.head = nn.Linear(width, 2)
        self._similarity: tuple[PairSimilarity, ...] = ()  # a plain tuple: not a submodule
        init_weights(self)

    def bind(self, objectives: nn.ModuleDict) -> None:
        """Hard negatives: find the contrastive objective named by ``similarity``."""
        if self.cfg.negatives != "hard":
            return
        found = objectives[self.cfg.similarity] if self.cfg.similarity in objectives else None  # noqa: SIM401
        if not isinstance(found, PairSimilarity):
            raise ValueError(
                f"itm.negatives=hard needs itm.similarity to name a contrastive objective of the "
                f"model, got {self.cfg.similarity!r} (objectives: {list(objectives)})"
            )
        self._similarity = (found,)

    def score(self, out: FusionOutput) -> torch.Tensor:
        """Matching logit margin [B] (higher = more likely a match), for retrieval."""
        logits_B2 = self.head(out.pooled["joint"]).float()
        return logits_B2[:, 1] - logits_B2[:, 0]

    def hard_pairs(self, out: FusionOutput) -> tuple[FusionOutput, torch.Tensor] | None:
        """ALBEF: the fused hard-negative pairs [2B] and the rows they came from [2B, 2]."""
        (sim,) = self._similarity
        a, b = sim.views
        B = out.pooled["joint"].shape[0]
        if a not in out.hidden or b not in out.hidden or B < 2:
            return None
        with torch.no_grad():
            s_AB = sim.scale() * sim.embed(out, a) @ sim.embed(out, b).T
            own = torch.eye(B, dtype=torch.bool, device=s_AB.device)
            # + 1e-4 keeps every other sample drawable when the softmax saturates (ALBEF)
            w_ab = (s_AB.softmax(1) + 1e-4).masked_fill(own, 0.0)
            w_ba = (s_AB.T.softmax(1) + 1e-4).masked_fill(own, 0.0)
            neg_b = torch.multinomial(w_ab, 1).squeeze(1)  # per a: a confusable b
            neg_a = torch.multinomial(w_ba, 1).squeeze(1)  # per b: a confusable a
        idx = torch.arange(B, device=s_AB.device)
        rows = {a: torch.cat([idx, neg_a]), b: torch.cat([neg_b, idx])}
        extra = [m for m in out.hidden if m not in rows]
        if extra:
            raise ValueError(f"itm hard negatives pair {a!r} and {b!r}; the batch also has {extra}")
        return out.repair(rows), torch.stack([rows[a], rows[b]], dim=1)

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        if "joint" not in out.pooled and ("itm_labels" in batch or self._similarity):
            raise ValueError("itm needs a fusion module with cross-modal layers (pooled['joint'])")
        if self.cfg.negatives == "hard":
            hard = self.hard_pairs(out)
            if hard is None:  # a batch without both sides: inactive
                return {}
            neg, _ = hard
            joint = torch.cat([out.pooled["joint"], neg.pooled["joint"]])
            B = out.pooled["joint"].shape[0]
            labels_B = torch.zeros(len(joint), dtype=torch.long, device=joint.device)
            labels_B[:B] = 1
        elif "itm_labels" in batch:
            joint, labels_B = out.pooled["joint"], batch["itm_labels"]
        else:  # inactive on this batch (see the data side)
            return {}
        logits_B2 = self.head(joint).float()
        loss = F.cross_entropy(logits_B2, labels_B)
        acc = (logits_B2.argmax(-1) == labels_B).float().mean()
        return {"loss": loss, "acc": acc.detach()}
