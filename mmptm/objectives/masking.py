"""Seeded selection of positions to mask: single positions (MLM, masked region modelling) and
spans of steps (wav2vec 2.0, HuBERT), plus the span-masking data side of audio views and the
settings its objectives share (:class:`SpanMaskConfig`).

Legend: B batch, N positions (tokens or regions), T steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from mmptm.batch import Batch
from mmptm.modalities.base import view_prefix


def select_positions(
    candidates_BN: torch.Tensor,
    prob: float,
    g: torch.Generator,
    *,
    groups_BN: torch.Tensor | None = None,
    at_least_one: bool = False,
) -> torch.Tensor:
    """Bool [B,N]: each candidate position (or group of them) selected with ``prob``.

    ``groups_BN`` (long, ids in [0, N]) selects positions with the same id together: one draw
    per id, so a group is in or out as a whole (whole-word masking); non-candidate positions
    are never selected whatever their group. With ``at_least_one`` a sample left empty by
    chance that has any candidate gets one candidate position, drawn uniformly, selected
    (with its whole group).

    The draws, in order: ``rand(B, N)`` (``rand(B, N + 1)`` with groups), then
    ``rand(B, N)`` only with ``at_least_one``; callers' later draws rely on this.
    """
    candidates_BN = candidates_BN.bool()
    B, N = candidates_BN.shape
    if groups_BN is None:
        draw_BN = torch.rand(B, N, generator=g)
    else:
        draw_BN = torch.rand(B, N + 1, generator=g).gather(1, groups_BN)
    selected_BN = candidates_BN & (draw_BN < prob)
    if at_least_one:
        # UNITER masks at least one region: an empty sample would carry no signal.
        score_BN = torch.rand(B, N, generator=g).masked_fill(~candidates_BN, 2.0)
        forced_B = score_BN.argmin(dim=1)
        need_B = candidates_BN.any(dim=1) & ~selected_BN.any(dim=1)
        if groups_BN is None:
            selected_BN[need_B, forced_B[need_B]] = True
        else:
            group_B1 = groups_BN.gather(1, forced_B.unsqueeze(1))
            selected_BN |= need_B.unsqueeze(1) & candidates_BN & (groups_BN == group_B1)
    return selected_BN


def select_spans(
    real_BT: torch.Tensor, prob: float, length: int, min_spans: int, g: torch.Generator
) -> torch.Tensor:
    """Bool [B,T]: spans of ``length`` steps over each row's real steps (wav2vec 2.0 masking).

    fairseq's ``compute_mask_indices`` with ``mask_type=static`` and overlaps allowed, in the
    parametrisation of the wav2vec 2.0 paper: ``prob`` is the probability of a real step to
    start a span (fairseq's and HF's ``mask_prob`` / ``mask_time_prob`` is ``prob * length``:
    0.65 there is 0.065 here). A row with n real steps gets ``floor(prob * n + u)`` spans (u
    uniform in [0, 1): rounding at random, so the mean is ``prob * n``), at least
    ``min_spans``, at most the number of start candidates; their starts are drawn uniformly
    without replacement from the steps ``0 .. n - length`` (so a span fits in the row; a row
    shorter than ``length`` has the one start 0 and its span is clipped to the real steps).
    Spans may overlap: a long row has about ``1 - (1 - prob) ** length`` of its steps masked
    (49% for 0.065 and 10). Rows without real steps get none. Real steps must be a prefix of
    each row (as a plug-in's steps mask is).

    Unlike fairseq (``require_same_masks``) rows keep their own number of masked steps: the
    objectives here do not need equal counts per row.

    The draws, in order: ``rand(B)`` (rounding), ``rand(B, T)`` (start order).
    """
    if length < 1 or min_spans < 0 or not 0.0 <= prob <= 1.0:
        raise ValueError(f"span masking needs length >= 1, min_spans >= 0, prob in [0, 1]; "
                         f"got {length}, {min_spans}, {prob}")  # fmt: skip
    real_BT = real_BT.bool()
    B, T = real_BT.shape
    n_B = real_BT.sum(dim=1)
    last_B = (n_B - length).clamp_min(0)  # last start whose span fits
    step_T = torch.arange(T)
    candidate_BT = real_BT & (step_T[None, :] <= last_B[:, None])
    spans_B = torch.floor(prob * n_B + torch.rand(B, generator=g)).long()
    spans_B = torch.minimum(spans_B.clamp_min(min_spans), candidate_BT.sum(dim=1))
    # the spans_B candidates with the smallest scores: a uniform draw without replacement
    score_BT = torch.rand(B, T, generator=g).masked_fill(~candidate_BT, 2.0)
    sorted_BT = score_BT.sort(dim=1).values
    cut_B = sorted_BT.gather(1, (spans_B - 1).clamp_min(0)[:, None]).squeeze(1)
    start_BT = candidate_BT & (score_BT <= cut_B[:, None]) & (spans_B > 0)[:, None]
    # step t is covered when a span starts in (t - length, t]
    csum_BT = torch.nn.functional.pad(start_BT.long().cumsum(dim=1), (length, 0))
    covered_BT = (csum_BT[:, length:] - csum_BT[:, :T]) > 0
    return covered_BT & real_BT


@dataclass(frozen=True)
class MaskSpans:
    """Span masking over an audio view: ``<prefix>audio_steps_mask`` [B,T'] (real encoder
    steps) → ``<prefix>audio_masked`` [B,T'] (where the encoder puts its [MASK] embedding).

    The data side of ``wav2vec2`` and ``hubert``; batches without the view pass unchanged.
    Two objectives on one view write one key: the later data side's spans are the ones both
    predict.
    """

    data_priority: ClassVar[int] = 20

    prefix: str
    mask_prob: float
    mask_length: int
    min_masks: int

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        key = f"{self.prefix}audio_steps_mask"
        if key not in batch:  # another source of a mixture, or a plug-in without ``steps``
            return batch
        batch[f"{self.prefix}audio_masked"] = select_spans(
            batch[key], self.mask_prob, self.mask_length, self.min_masks, g
        )
        return batch


def audio_encoder(encoders: Any, view: str, where: str) -> Any:
    """The model's audio encoder named ``view``; one error naming ``where`` otherwise."""
    enc = encoders[view] if view in encoders else None  # noqa: SIM401 (a ModuleDict)
    if enc is None or enc.modality != "audio":
        raise ValueError(f"{where}={view!r} is not an audio encoder of this model")
    return enc


def span_masking(where: str, prefix: str, mask_prob: float, mask_length: int,
                 min_masks: int) -> MaskSpans:  # fmt: skip
    """A checked :class:`MaskSpans` (``where`` names the objective in errors)."""
    if not 0.0 < mask_prob < 1.0:
        raise ValueError(f"{where}.mask_prob must be in (0, 1), got {mask_prob}")
    if mask_length < 1 or min_masks < 0:
        raise ValueError(f"{where}: mask_length must be >= 1 and min_masks >= 0, got "
                         f"{mask_length}, {min_masks}")  # fmt: skip
    return MaskSpans(prefix, mask_prob, mask_length, min_masks)


@dataclass
class SpanMaskConfig:
    """The settings of the objectives that mask spans of an audio view (wav2vec 2.0, HuBERT).

    Their ``Config`` inherits it, so recipes keep the keys flat (``mask_prob``, not
    ``masking.mask_prob``) and a subclass may change a default by declaring the field again;
    ``type`` and ``weight`` sit here so that they stay an objective's first keys."""

    type: str = ""
    weight: float = 1.0
    #: the audio encoder (view, and hidden-state stream) this objective reads
    modality: str = "audio"
    #: probability of a real step to start a masked span (fairseq's mask_prob / length)
    mask_prob: float = 0.065
    mask_length: int = 10
    min_masks: int = 2

    @property
    def prefix(self) -> str:
        """The batch-key prefix of the view (``""`` for ``audio``)."""
        return view_prefix("audio", self.modality)

    def span_masking(self) -> MaskSpans:
        """The checked data side of these settings (errors name the objective's ``type``)."""
        return span_masking(
            self.type, self.prefix, self.mask_prob, self.mask_length, self.min_masks
        )
