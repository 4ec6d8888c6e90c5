"""Task heads on character spans: entity typing and relation classification (fine-tuning).

Both read the text plug-in's span masks (``<span>_mask [B,L]``, True on every piece of the
span; the head declares ``data.modalities.text.spans``, so the recipe need not) and the
``label_set`` plug-in (``label_set [B,C]`` multi-hot over the head's ``labels`` vocabulary,
``label_unknown [B]``: names the vocabulary lacks).

- ``entity_typing`` (Open Entity, Choi et al. 2018): the mention's pieces pooled → dropout →
  linear → one logit per type; binary cross-entropy (multi-label); a type is predicted when
  its probability exceeds ``threshold``.
- ``relation_classification`` (TACRED, FewRel): [CLS] ‖ pooled subject ‖ pooled object →
  dropout → linear → softmax over relations (Baldini Soares et al. 2019's "entity start" with
  ``pool: start``, span mean with ``pool: mean``); a sample whose relation the vocabulary
  lacks gets no loss.

Pooling: ``mean`` over the span's pieces, or ``start``: its first piece. A span that
truncation cut off pools to zeros (``mean``) or [CLS] (``start``).

Metrics (pure functions, also what ``mmptm eval spans`` reports):

- :func:`typing_scores`: micro precision / recall / F1 over all (sample, type) decisions,
  a gold type missing from the vocabulary counting as missed; macro = Open Entity's "loose
  macro": precision and recall averaged over samples (precision over samples with a
  prediction), F1 of those two.
- :func:`relation_scores`: accuracy, and TACRED's micro precision / recall / F1 in which
  the ``negative`` relation (``no_relation``) counts as no prediction and no gold fact.

Legend: B batch, L tokens, D width, C labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need, view_prefix
from mmptm.modalities.labels import read_labels
from mmptm.objectives.base import Objective
from mmptm.registry import OBJECTIVES

POOLS = ("mean", "start")


def span_pool(h_BLD: torch.Tensor, mask_BL: torch.Tensor, how: str) -> torch.Tensor:
    """One vector [B,D] per row: the mean over the span's pieces, or its first piece."""
    if how == "mean":
        m_BL1 = mask_BL.unsqueeze(-1).to(h_BLD.dtype)
        return (h_BLD * m_BL1).sum(1) / m_BL1.sum(1).clamp_min(1)
    first_B = mask_BL.long().argmax(1)  # 0 ([CLS]) for a row without the span
    return h_BLD[torch.arange(len(h_BLD), device=h_BLD.device), first_B]


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def typing_scores(
    pred_NC: torch.Tensor, gold_NC: torch.Tensor, unknown_N: torch.Tensor | None = None
) -> dict[str, float]:
    """Micro and loose-macro precision / recall / F1 of multi-label predictions (bool [N,C]);
    ``unknown_N``: gold labels outside the vocabulary, counted as missed."""
    pred, gold = pred_NC.bool(), gold_NC.bool()
    missed_N = torch.zeros(len(pred), dtype=torch.long) if unknown_N is None else unknown_N.long()
    tp_N = (pred & gold).sum(1).double()
    npred_N, ngold_N = pred.sum(1).double(), gold.sum(1).double() + missed_N
    p = float(tp_N.sum() / npred_N.sum()) if npred_N.sum() > 0 else 0.0
    r = float(tp_N.sum() / ngold_N.sum()) if ngold_N.sum() > 0 else 0.0
    some_pred, some_gold = npred_N > 0, ngold_N > 0
    mp = float((tp_N[some_pred] / npred_N[some_pred]).mean()) if some_pred.any() else 0.0
    mr = float((tp_N[some_gold] / ngold_N[some_gold]).mean()) if some_gold.any() else 0.0
    return {"n": len(pred), "micro_p": p, "micro_r": r, "micro_f1": _f1(p, r),
            "macro_p": mp, "macro_r": mr, "macro_f1": _f1(mp, mr)}  # fmt: skip


def relation_scores(
    pred_N: torch.Tensor, gold_N: torch.Tensor, negative: int | None = None
) -> dict[str, float]:
    """Accuracy and TACRED's micro precision / recall / F1 (``negative``: the no-relation
    class, excluded; gold -1 = a relation outside the vocabulary, never predicted right)."""
    pred, gold = pred_N.long(), gold_N.long()
    correct = pred == gold
    neg = -2 if negative is None else negative  # -2 matches nothing
    pred_pos, gold_pos = pred != neg, gold != neg
    tp = int((correct & gold_pos).sum())
    p = tp / int(pred_pos.sum()) if pred_pos.any() else 0.0
    r = tp / int(gold_pos.sum()) if gold_pos.any() else 0.0
    acc = float(correct.double().mean()) if len(pred) else 0.0
    return {"n": len(pred), "acc": acc, "p": p, "r": r, "f1": _f1(p, r)}


class SpanTask(Objective):
    """What the span heads share: the label vocabulary, the declared data, predictions."""

    def _setup(self, cfg, spans: tuple[str, ...]) -> None:
        if not cfg.labels:
            raise ValueError(f"{cfg.type}.labels is empty: give the label vocabulary file")
        if cfg.pool not in POOLS:
            raise ValueError(f"{cfg.type}.pool must be one of {POOLS}, got {cfg.pool!r}")
        self.cfg = cfg
        self.labels = read_labels(cfg.labels)
        if len(self.labels) < 2:
            raise ValueError(f"{cfg.labels}: a task head needs at least 2 labels")
        self.spans = spans
        self.prefix = view_prefix("text", cfg.modality)

    def data_needs(self) -> dict[str, Need]:
        return {
            self.cfg.modality: Need("text", {"spans": {s: s for s in self.spans}}),
            "label_set": Need("label_set", {"names_file": self.cfg.labels}),
        }

    def _pooled(self, out: FusionOutput, batch: Batch) -> list[torch.Tensor]:
        h_BLD = out.hidden[self.cfg.modality]
        masks = [batch[f"{self.prefix}{s}_mask"] for s in self.spans]
        return [span_pool(h_BLD, m_BL, self.cfg.pool) for m_BL in masks]

    def logits(self, out: FusionOutput, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def predict(self, logits_BC: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def gold(self, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def scores(self, pred: torch.Tensor, gold: torch.Tensor, unknown: torch.Tensor) -> dict:
        raise NotImplementedError


@OBJECTIVES.register("entity_typing")
class EntityTyping(SpanTask):
    """Multi-label entity typing at the ``mention`` span (module docstring)."""

    @dataclass
    class Config:
        type: str = "entity_typing"
        weight: float = 1.0
        #: the type vocabulary (``labels.txt`` of ``mmptm data typing``'s train split)
        labels: str = ""
        #: the text view and hidden-state stream it reads
        modality: str = "text"
        #: the span annotation (json field and batch name) of the mention
        span: str = "mention"
        pool: str = "mean"
        dropout: float = 0.1
        #: a type is predicted when sigmoid(logit) > threshold
        threshold: float = 0.5

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        self._setup(cfg, (cfg.span,))
        if not 0.0 < cfg.threshold < 1.0:
            raise ValueError(f"entity_typing.threshold must be in (0, 1), got {cfg.threshold}")
        self.head = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(width, len(self.labels)))
        init_weights(self)

    def logits(self, out: FusionOutput, batch: Batch) -> torch.Tensor:
        return self.head(self._pooled(out, batch)[0]).float()  # [B,C]

    def predict(self, logits_BC: torch.Tensor) -> torch.Tensor:
        return logits_BC.sigmoid() > self.cfg.threshold

    def gold(self, batch: Batch) -> torch.Tensor:
        return batch["label_set"] > 0

    def scores(self, pred: torch.Tensor, gold: torch.Tensor, unknown: torch.Tensor) -> dict:
        return typing_scores(pred, gold, unknown)

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        logits_BC = self.logits(out, batch)
        target_BC = batch["label_set"].to(logits_BC.dtype)
        loss = F.binary_cross_entropy_with_logits(logits_BC, target_BC)
        f1 = typing_scores(self.predict(logits_BC).cpu(), target_BC.cpu() > 0)["micro_f1"]
        return {"loss": loss, "f1": torch.tensor(f1)}


@OBJECTIVES.register("relation_classification")
class RelationClassification(SpanTask):
    """Softmax over relations from [CLS] and the pooled subject and object spans."""

    @dataclass
    class Config:
        type: str = "relation_classification"
        weight: float = 1.0
        #: the relation vocabulary (``labels.txt`` of ``mmptm data relations``'s train split)
        labels: str = ""
        modality: str = "text"
        #: span annotations of the subject and the object
        subject: str = "subj"
        object: str = "obj"
        pool: str = "start"
        dropout: float = 0.1
        #: the "no relation" label, left out of precision / recall / F1 ("" = none, FewRel)
        negative: str = "no_relation"

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        self._setup(cfg, (cfg.subject, cfg.object))
        if cfg.negative and cfg.negative not in self.labels:
            raise ValueError(
                f"relation_classification.negative={cfg.negative!r} is not in {cfg.labels} "
                "(set negative: '' for data without a no-relation class)"
            )
        self.head = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(3 * width, len(self.labels)))
        init_weights(self)

    @property
    def negative_index(self) -> int | None:
        return self.labels.index(self.cfg.negative) if self.cfg.negative else None

    def logits(self, out: FusionOutput, batch: Batch) -> torch.Tensor:
        cls_BD = out.hidden[self.cfg.modality][:, 0]
        return self.head(torch.cat([cls_BD, *self._pooled(out, batch)], -1)).float()  # [B,C]

    def predict(self, logits_BC: torch.Tensor) -> torch.Tensor:
        return logits_BC.argmax(-1)

    def gold(self, batch: Batch) -> torch.Tensor:
        """The relation index per sample, -1 when the vocabulary lacks it."""
        hot_BC = batch["label_set"]
        if bool((hot_BC.sum(1) > 1).any()):
            raise ValueError("relation_classification: a sample has several relations")
        return torch.where(hot_BC.sum(1) > 0, hot_BC.argmax(1), -1)

    def scores(self, pred: torch.Tensor, gold: torch.Tensor, unknown: torch.Tensor) -> dict:
        return relation_scores(pred, gold, self.negative_index)

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        logits_BC = self.logits(out, batch)
        gold_B = self.gold(batch)
        n = int((gold_B >= 0).sum())
        loss = F.cross_entropy(logits_BC, gold_B.clamp_min(0), reduction="none")
        loss = (loss * (gold_B >= 0)).sum() / max(n, 1)  # no NaN for a batch of unknowns
        acc = (self.predict(logits_BC) == gold_B).float().mean()
        return {"loss": loss, "acc": acc.detach()}


__all__ = [
    "EntityTyping",
    "RelationClassification",
    "SpanTask",
    "relation_scores",
    "span_pool",
    "typing_scores",
]
