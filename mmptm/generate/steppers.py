"""Steppers: a trained model's generative objective as the step function decoding runs.

- :class:`DecoderStepper` (``lm``): the context is encoded once; the decoder runs one new
  piece per step with its KV cache (or the whole prefix again, ``use_cache=False``).
- :class:`FusionStepper` (``clm``, and ``mlm`` trained with seq2seq rows as VLP): each step
  fuses the conditioning views with the text so far under the objective's attention mode and
  reads the last position; for MLM the text ends with a [MASK] whose prediction is the next
  piece (UniLM's and VLP's decoding). These re-run the fusion every step (no cache).

Legend: B rows, T pieces so far, M context tokens, D width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mmptm.batch import ATTENTION_MODE, ATTENTION_MODES, ATTENTION_TARGET, Batch, is_meta
from mmptm.layers.decoder import DecoderCache
from mmptm.modalities.base import view_prefix
from mmptm.objectives.lm import DecoderLM


@dataclass
class DecoderState:
    """The rows' context states, their language, and the decoder's cache (or None)."""

    ctx_BMD: torch.Tensor
    ctx_mask_BM: torch.Tensor
    lang_B: torch.Tensor
    cache: DecoderCache | None


class DecoderStepper:
    """Drives an ``lm`` objective's decoder."""

    def __init__(self, objective: DecoderLM, use_cache: bool = True) -> None:
        self.objective = objective
        self.use_cache = use_cache

    def initial(
        self, ctx_BMD: torch.Tensor, ctx_mask_BM: torch.Tensor, lang_B: torch.Tensor
    ) -> DecoderState:
        cache = self.objective.decoder.new_cache() if self.use_cache else None
        return DecoderState(ctx_BMD, ctx_mask_BM, lang_B, cache)

    def step(self, ids_BT: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, Any]:
        logits_BV = self.objective.next_logits(
            ids_BT, state.ctx_BMD, state.ctx_mask_BM, state.lang_B, state.cache
        )
        return logits_BV, state

    def reorder(self, state: DecoderState, index_B: torch.Tensor) -> DecoderState:
        if state.cache is not None:
            state.cache.reorder(index_B)
        return DecoderState(
            state.ctx_BMD.index_select(0, index_B),
            state.ctx_mask_BM.index_select(0, index_B),
            state.lang_B.index_select(0, index_B),
            state.cache,
        )


class FusionStepper:
    """Drives a model whose fused text predicts the next piece (``clm``, or ``mlm`` with a
    trailing [MASK]) under an attention mode."""

    def __init__(
        self,
        model: torch.nn.Module,
        objective: torch.nn.Module,
        *,
        view: str,
        mode: str,
        mask_id: int | None = None,
    ) -> None:
        self.model, self.objective = model, objective
        self.view, self.prefix = view, view_prefix("text", view)
        self.mode = ATTENTION_MODES.index(mode)
        #: MLM decoding: the id appended at the position to predict
        self.mask_id = mask_id

    def step(self, ids_BT: torch.Tensor, state: Batch) -> tuple[torch.Tensor, Any]:
        if self.mask_id is not None:
            ids_BT = torch.cat([ids_BT, torch.full_like(ids_BT[:, :1], self.mask_id)], dim=1)
        B, T = ids_BT.shape
        p = self.prefix
        batch = dict(state["rows"])
        batch[f"{p}input_ids"] = ids_BT
        batch[f"{p}attention_mask"] = torch.ones_like(ids_BT, dtype=torch.bool)
        batch[f"{p}lang_ids"] = state["lang_B"][:, None].expand(B, T)
        batch[ATTENTION_MODE] = torch.full((B,), self.mode, dtype=torch.long, device=ids_BT.device)
        batch[ATTENTION_TARGET] = self.view
        h_BD = self.model.fuse(batch).hidden[self.view][:, -1]
        return self.objective.logits(h_BD), state

    def reorder(self, state: Batch, index_B: torch.Tensor) -> Batch:
        rows = {
            k: v.index_select(0, index_B) if isinstance(v, torch.Tensor) else v
            for k, v in state["rows"].items()
            if not is_meta(k)
        }
        return {"rows": rows, "lang_B": state["lang_B"].index_select(0, index_B)}
