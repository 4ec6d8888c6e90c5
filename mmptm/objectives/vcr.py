"""Multiple choice (VCR, Zellers et al. 2019): which of a question's choices is right? The head.

Data side (:class:`ChoiceRows`): each sample (the question, the image's regions, ``C``
choices from the ``choices`` plug-in) becomes ``C`` consecutive rows, the question with each
choice: every per-sample key repeated ``C`` times (text, regions, keys), the choices
flattened into the second text view (``text2_*``, [B*C,L]), which the text plug-in's
:class:`~mmptm.modalities.text.PackPairs` then joins to the question in the model's own
layout (``[CLS] question [SEP] choice [SEP]`` for BERT's). ``choice_labels [B]`` stays one a
sample. The model fuses B*C rows as it fuses any batch (UNITER's and VL-BERT's VCR setup; for
QA→R the question is VCR's question followed by its right answer, as the converters write it).

Head: each row's pooled vector through an MLP → one score; the ``C`` scores of a sample are
its logits, trained with cross-entropy against ``choice_labels``; the metric is accuracy.

Legend: B samples, C choices, L tokens, D width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from mmptm.batch import Batch
from mmptm.encoders.base import init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need
from mmptm.objectives.base import Objective
from mmptm.objectives.heads import mlp_head
from mmptm.objectives.rows import repeat_rows
from mmptm.registry import OBJECTIVES

_CHOICE_KEYS = ("choice_ids", "choice_mask", "choice_labels")
#: the text view the rows' question is in, and the view PackPairs joins to it
_FIRST, _SECOND = "", "text2_"


@dataclass(frozen=True)
class ChoiceRows:
    """Each sample → ``C`` rows, the question with each choice (module docstring)."""

    data_priority: ClassVar[int] = 12  # after negatives (10), before text joining (15)

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        if "choice_ids" not in batch:
            return batch
        if f"{_SECOND}input_ids" in batch:
            raise ValueError(
                "multiple_choice: the samples' text is already a pair; the question must be "
                "one text (json.question) for each choice to join it"
            )
        ids_BCL = batch["choice_ids"]
        B, C, L = ids_BCL.shape
        out: Batch = {"choice_labels": batch["choice_labels"]}
        for key, value in batch.items():
            if key not in _CHOICE_KEYS:
                out[key] = repeat_rows(value, B, C)
        N = B * C
        lang_N1 = out[f"{_FIRST}lang_ids"][:, :1]
        second = {
            "input_ids": ids_BCL.reshape(N, L),  # [B,C,L] → [B*C,L], sample-major
            "attention_mask": batch["choice_mask"].reshape(N, L),
            "segment_ids": torch.zeros(N, L, dtype=torch.long),
            "lang_ids": lang_N1.expand(N, L).contiguous(),  # a choice is in its question's
        }
        shape = out[f"{_FIRST}input_ids"].shape
        for key, value in list(out.items()):  # span annotations: none on a choice
            name = key[len(_FIRST) : -len("_ids")]
            if key.endswith("_ids") and f"{_FIRST}{name}_mask" in out and value.shape == shape:
                second[f"{name}_ids"] = torch.full((N, L), -1, dtype=value.dtype)
                second[f"{name}_mask"] = torch.zeros(N, L, dtype=torch.bool)
        out.update({f"{_SECOND}{k}": v for k, v in second.items()})
        return out


@OBJECTIVES.register("multiple_choice")
class MultipleChoiceHead(Objective):
    """The right one of a sample's choices, from one score per (question, choice) row."""

    @dataclass
    class Config:
        type: str = "multiple_choice"
        weight: float = 1.0
        #: choices per sample (VCR: 4); fixes the ``choices`` plug-in's count
        choices: int = 4
        #: which pooled vector of each row
        pooled: str = "joint"
        #: hidden size of the MLP as a multiple of the width (UNITER's VCR head: 2)
        hidden_mult: int = 2
        layer_norm_eps: float = 1e-12

    @classmethod
    def data_transform(cls, cfg: Config, vocab: object, **_: Any) -> ChoiceRows:
        return ChoiceRows()

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        if cfg.hidden_mult < 1:
            raise ValueError(f"multiple_choice.hidden_mult must be >= 1, got {cfg.hidden_mult}")
        if cfg.choices < 2:
            raise ValueError(f"multiple_choice.choices must be >= 2, got {cfg.choices}")
        self.cfg = cfg
        hidden = cfg.hidden_mult * width
        self.head = mlp_head(width, hidden, 1, cfg.layer_norm_eps)
        init_weights(self)

    def data_needs(self) -> dict[str, Need]:
        return {"choices": Need("choices", {"count": self.cfg.choices})}

    def logits(self, out: FusionOutput) -> torch.Tensor:
        """[B,C] scores of each sample's choices, from its ``C`` consecutive rows."""
        if self.cfg.pooled not in out.pooled:
            raise ValueError(
                f"multiple_choice.pooled={self.cfg.pooled!r} is not produced by this fusion "
                f"(has {sorted(out.pooled)})"
            )
        p_ND = out.pooled[self.cfg.pooled]
        C = self.cfg.choices
        if p_ND.shape[0] % C:
            raise ValueError(
                f"multiple_choice: {p_ND.shape[0]} rows are not {C} a sample (the ChoiceRows "
                "data side did not run)"
            )
        return self.head(p_ND).float().reshape(-1, C)  # [B*C,1] → [B,C]

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        if "choice_labels" not in batch:
            return {}
        logits_BC = self.logits(out)
        labels_B = batch["choice_labels"].to(logits_BC.device)
        loss = F.cross_entropy(logits_BC, labels_B)
        acc = (logits_BC.argmax(-1) == labels_B).float().mean()
        return {"loss": loss, "acc": acc.detach()}


__all__ = ["ChoiceRows", "MultipleChoiceHead"]
