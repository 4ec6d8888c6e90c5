"""What every fusion module is: the base class (data needs, ``forward(tokens, batch)``) and
the typed output it returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import ModalityTokens
from mmptm.modalities.base import Need


@dataclass
class FusionOutput:
    """Per-modality hidden states and pooled vectors.

    ``hidden[m]`` is [B,N_m,D] and ``mask[m]`` [B,N_m] for each modality m in the batch;
    ``pooled[m]`` is [B,D]. Fusion modules with cross-modal layers also give
    ``pooled["joint"]``: the pooled vector of the pair (ITM, VQA heads read it).

    ``unimodal[m]`` [B,D] is modality m pooled *before* any cross-modal layer (what an
    ALBEF-style contrastive loss aligns ahead of fusion), from fusion modules with a
    unimodal stage; ``unimodal_vector(m)`` falls back to the mean of the encoder tokens
    (``encoded``, which ``PretrainModel.fuse`` records).
    ``repair(rows)`` fuses again with modality m's rows taken at ``rows[m]`` (index [B'],
    any length) without re-encoding: the pairs of hard negatives.
    """

    hidden: dict[str, torch.Tensor]
    mask: dict[str, torch.Tensor]
    pooled: dict[str, torch.Tensor]
    unimodal: dict[str, torch.Tensor] = field(default_factory=dict)
    repair: Callable[[dict[str, torch.Tensor]], FusionOutput] | None = None
    encoded: dict[str, ModalityTokens] = field(default_factory=dict)

    def unimodal_vector(self, m: str) -> torch.Tensor:
        """Modality m [B,D] before cross-modal layers (computed only when asked for)."""
        if m in self.unimodal:
            return self.unimodal[m]
        if m not in self.encoded:
            raise KeyError(f"no unimodal vector for {m!r} (have {sorted(self.encoded)})")
        t = self.encoded[m]
        return pool(t.tokens, t.mask, "mean")


class Fusion(nn.Module):
    """Base of the fusion modules (registered with ``FUSIONS``).

    ``forward(tokens, batch)`` gets every encoder's ``ModalityTokens`` and the batch itself,
    so a fusion layer can read extra keys it declared in :meth:`data_needs` (e.g. entity ids
    aligned to the text tokens, from the text plug-in's ``spans``). ``batch`` is None when
    ``FusionOutput.repair`` fuses re-indexed rows again (hard negatives).
    """

    #: whether the modalities may come at widths of their own (``model.widths``): only a
    #: fusion without cross-modal layers, whose towers never mix the streams
    per_view_widths: ClassVar[bool] = False
    #: whether the text view's ``visible_mask [B,L,L]`` limits its attention (needed by
    #: packed rows: ``data.sources.<name>.pack``)
    reads_visible_mask: ClassVar[bool] = False

    def data_needs(self) -> dict[str, Need]:
        """Data this module reads besides the encoders' tokens (default: none)."""
        return {}

    def forward(
        self, tokens: dict[str, ModalityTokens], batch: Batch | None = None
    ) -> FusionOutput:
        raise NotImplementedError


#: the ways :func:`pool` reduces a token sequence to one vector
POOLINGS = ("first", "mean", "last")


def pool(x_BND: torch.Tensor, mask_BN: torch.Tensor, how: str) -> torch.Tensor:
    """Pool a token sequence: ``first`` token (CLS), masked ``mean``, or ``last`` real token
    (a causal tower's summary: CLIP's text tower pools at its closing end-of-text token)."""
    if how == "first":
        return x_BND[:, 0]
    if how == "mean":
        m_BN1 = mask_BN.unsqueeze(-1).to(x_BND.dtype)
        return (x_BND * m_BN1).sum(1) / m_BN1.sum(1).clamp_min(1.0)
    if how == "last":
        N = mask_BN.shape[1]
        last_B = N - 1 - mask_BN.flip(1).int().argmax(1)  # the last True of each row
        return x_BND[torch.arange(len(x_BND), device=x_BND.device), last_B]
    raise ValueError(f"unknown pooling {how!r}; choices: {', '.join(POOLINGS)}")


def join_tokens(
    tokens: dict[str, ModalityTokens],
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The modalities' tokens [B,N,D] and key masks [B,N] concatenated in order, and each
    modality's length (what one joint Transformer reads)."""
    sizes = [t.tokens.shape[1] for t in tokens.values()]
    x_BND = torch.cat([t.tokens for t in tokens.values()], dim=1)
    mask_BN = torch.cat([t.mask for t in tokens.values()], dim=1)
    return x_BND, mask_BN, sizes


def split_joint(
    x_BND: torch.Tensor,
    tokens: dict[str, ModalityTokens],
    sizes: list[int],
    how: str,
    pooler: nn.Module | None,
) -> FusionOutput:
    """A joint Transformer's states split back per modality and pooled (``how``), with
    ``pooled["joint"]`` from the first token (through ``pooler``, if any)."""
    hidden = dict(zip(tokens, torch.split(x_BND, sizes, dim=1)))
    mask = {m: t.mask for m, t in tokens.items()}
    pooled = {m: pool(hidden[m], mask[m], how) for m in tokens}
    first_BD = x_BND[:, 0]
    pooled["joint"] = pooler(first_BD) if pooler is not None else first_BD
    return FusionOutput(hidden, mask, pooled)
