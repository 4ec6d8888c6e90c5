"""The attention-mode data side objectives share: which self-attention pattern each row of a
batch trains with in a single-stream fusion (VLP mixes bidirectional and seq2seq rows; XLM's
CLM and a prefix LM train every row causally or seq2seq).

The pattern travels in the batch (``ATTENTION_MODE``, one per row, and the ``seq2seq`` target
modality), so packing, negatives and the other objectives' data sides need not know of it; a
fusion that cannot apply it refuses the objective (:func:`check_fusion`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from mmptm.batch import ATTENTION_MODE, ATTENTION_MODES, ATTENTION_TARGET, Batch


def mode_weights(modes: Mapping[str, float], where: str) -> tuple[float, ...]:
    """Weights over ``ATTENTION_MODES`` from a ``{mode: weight}`` setting; errors name ``where``."""
    unknown = sorted(set(modes) - set(ATTENTION_MODES))
    if unknown:
        raise ValueError(f"{where} names {unknown}; attention modes: {list(ATTENTION_MODES)}")
    weights = tuple(float(modes.get(m, 0.0)) for m in ATTENTION_MODES)
    if any(w < 0 for w in weights) or not sum(weights) > 0:
        raise ValueError(f"{where} needs non-negative weights, one of them positive: {modes}")
    return weights


@dataclass
class AttentionModes:
    """Draws each row's attention mode by weight (seeded) and names the ``seq2seq`` target.

    Runs after pairs are joined and rows packed (their row count is the model's), before
    masking."""

    data_priority: ClassVar[int] = 19

    #: one weight per ``ATTENTION_MODES`` entry
    weights: tuple[float, ...]
    target: str = "text"

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        rows = _rows(batch)
        w = torch.tensor(self.weights, dtype=torch.float)
        if (w > 0).sum() == 1:  # one mode: no draw, so other seeded draws stay where they were
            mode_B = torch.full((rows,), int(w.argmax()), dtype=torch.long)
        else:
            mode_B = torch.multinomial(w, rows, replacement=True, generator=g)
        batch[ATTENTION_MODE] = mode_B
        batch[ATTENTION_TARGET] = self.target
        return batch


def _rows(batch: Batch) -> int:
    """The batch's row count: its text's, else its first tensor's."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].shape[0])
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    raise ValueError("attention modes: the batch has no tensor to count its rows by")


def check_fusion(fusion: object, where: str) -> None:
    """Refuse a fusion that cannot apply per-row attention modes (two stream, dual)."""
    if not getattr(fusion, "reads_attention_modes", False):
        raise ValueError(
            f"{where}: attention modes need a single_stream fusion (this one is "
            f"{type(fusion).__name__}), which applies them to its one Transformer"
        )
