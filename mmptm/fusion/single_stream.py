"""Single-stream fusion (VisualBERT / UNITER / ViLT): one Transformer over all modalities.

Modalities are concatenated in the order the recipe lists the encoders, run through one
stack with a joint key-padding mask, and split back. Each row may carry an attention mode
(bidirectional, seq2seq as UniLM and VLP, causal: :func:`mode_patterns`), so one model trains
and generates with the same stack. With the text encoder alone it is a
BERT/XLM-R encoder. ``unimodal_layers`` puts a Transformer tower per modality in front of
the joint stack ("dual, then fusion", as ALBEF): ``unimodal[m]`` pools the tower's output,
so a contrastive objective can align the modalities before they meet.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch
from torch import nn

from mmptm.batch import ATTENTION_MODE, ATTENTION_MODES, ATTENTION_TARGET, Batch
from mmptm.encoders.base import ModalityTokens, init_weights
from mmptm.fusion.base import Fusion, FusionOutput, join_tokens, pool, split_joint
from mmptm.layers import TransformerConfig, TransformerStack
from mmptm.registry import FUSIONS


@FUSIONS.register("single_stream")
class SingleStreamFusion(Fusion):
    """One Transformer over the concatenated modalities; ``pooled["joint"]`` is the first token."""

    reads_visible_mask: ClassVar[bool] = True
    reads_attention_modes: ClassVar[bool] = True

    @dataclass
    class Config:
        type: str = "single_stream"
        transformer: TransformerConfig = field(default_factory=TransformerConfig)
        #: BERT pooler (Linear + tanh) on the first token for ``pooled["joint"]``
        pooler: bool = True
        #: pooling of each modality's own ``pooled[m]`` and ``unimodal[m]``: first | mean
        modality_pooling: str = "mean"
        #: per-modality tower layers before the joint stack, e.g. {text: 2, regions: 1}
        #: (same heads/dropout as ``transformer``); modalities not named have none
        unimodal_layers: dict[str, int] = field(default_factory=dict)

    def __init__(
        self, cfg: Config, *, width: int, modalities: list[str] | None = None, **_: object
    ) -> None:
        super().__init__()
        self.cfg = cfg
        unknown = set(cfg.unimodal_layers) - set(modalities or cfg.unimodal_layers)
        if unknown:
            raise ValueError(
                f"single_stream.unimodal_layers names {sorted(unknown)}, which have no encoder; "
                f"encoders: {modalities}"
            )
        self.towers = nn.ModuleDict(
            {
                m: TransformerStack(width, replace(cfg.transformer, layers=n))
                for m, n in cfg.unimodal_layers.items()
                if n > 0
            }
        )
        self.stack = TransformerStack(width, cfg.transformer)
        self.pooler = nn.Sequential(nn.Linear(width, width), nn.Tanh()) if cfg.pooler else None
        init_weights(self)

    def forward(
        self, tokens: dict[str, ModalityTokens], batch: Batch | None = None
    ) -> FusionOutput:
        states = {
            m: ModalityTokens(self.towers[m](t.tokens, t.mask), t.mask) if m in self.towers else t
            for m, t in tokens.items()
        }
        out = self._joint(states, self.visibility(states, batch))
        if self.towers:
            how = self.cfg.modality_pooling
            out.unimodal = {m: pool(t.tokens, t.mask, how) for m, t in states.items()}
            out.repair = lambda rows: self._joint(
                {m: ModalityTokens(t.tokens[rows[m]], t.mask[rows[m]]) for m, t in states.items()}
            )
        return out

    def visibility(
        self, tokens: dict[str, ModalityTokens], batch: Batch | None
    ) -> torch.Tensor | None:
        """A [B,N,N] visibility matrix over the concatenated tokens (True = may attend), or
        None for the key-padding mask alone.

        The text view's ``visible_mask [B,L,L]`` (K-BERT's sentence trees, packed rows)
        replaces the key-padding mask within the text; other modalities, if any, see and are
        seen as usual. Each row's ``attention_mode`` (seq2seq, causal; see
        ``mmptm.objectives.modes``) then narrows what it sees over the whole concatenation.
        """
        vis_BLL = batch.get("visible_mask") if batch is not None else None
        mode_B = batch.get(ATTENTION_MODE) if batch is not None else None
        if (vis_BLL is None or "text" not in tokens) and mode_B is None:
            return None
        mask_BN = torch.cat([t.mask for t in tokens.values()], dim=1)
        B, N = mask_BN.shape
        full_BNN = mask_BN[:, None, :].expand(B, N, N).clone()
        start = 0
        for m, t in tokens.items():  # the text block of the joint matrix
            if m == "text" and vis_BLL is not None:
                L = t.mask.shape[1]
                block_BLL = full_BNN[:, start : start + L, start : start + L]
                # a padding query keeps the plain key mask: a row seeing nothing gives NaN
                real_BL1 = t.mask[:, :, None]
                vis = vis_BLL.to(mask_BN.device)
                full_BNN[:, start : start + L, start : start + L] = torch.where(
                    real_BL1, block_BLL & vis, block_BLL
                )
                break
            start += t.mask.shape[1]
        if mode_B is not None:
            target = batch.get(ATTENTION_TARGET, "text")
            full_BNN &= mode_patterns(tokens, target, mask_BN.device)[mode_B.to(mask_BN.device)]
        return full_BNN

    def _joint(
        self, tokens: dict[str, ModalityTokens], visible_BNN: torch.Tensor | None = None
    ) -> FusionOutput:
        x_BND, mask_BN, sizes = join_tokens(tokens)
        x_BND = self.stack(x_BND, mask_BN if visible_BNN is None else visible_BNN)
        return split_joint(x_BND, tokens, sizes, self.cfg.modality_pooling, self.pooler)


def mode_patterns(
    tokens: dict[str, ModalityTokens], target: str, device: torch.device
) -> torch.Tensor:
    """[modes,N,N]: who may see whom under each of ``ATTENTION_MODES`` over the concatenated
    tokens, in order: all; the source sees the source and the ``target`` modality's tokens
    see the source and their own past (seq2seq); each token itself and earlier ones (causal)."""
    is_target_N = torch.cat(
        [torch.full((t.mask.shape[1],), m == target, dtype=torch.bool) for m, t in tokens.items()]
    ).to(device)
    N = is_target_N.numel()
    tril_NN = torch.ones(N, N, dtype=torch.bool, device=device).tril()
    seq2seq_NN = ~is_target_N[None, :] | (is_target_N[:, None] & is_target_N[None, :] & tril_NN)
    patterns = {"bidirectional": torch.ones_like(tril_NN), "seq2seq": seq2seq_NN, "causal": tril_NN}
    return torch.stack([patterns[m] for m in ATTENTION_MODES])
