"""Single-stream fusion (VisualBERT / UNITER / ViLT): one Transformer over all modalities.

Modalities are concatenated in the order the recipe lists the encoders, run through one
stack with a joint key-padding mask, and split back. With the text encoder alone it is a
BERT/XLM-R encoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from mmptm.encoders.base import ModalityTokens, init_weights
from mmptm.fusion.base import FusionOutput, pool
from mmptm.layers import TransformerConfig, TransformerStack
from mmptm.registry import FUSIONS


@FUSIONS.register("single_stream")
class SingleStreamFusion(nn.Module):
    """One Transformer over the concatenated modalities; ``pooled["joint"]`` is the first token."""

    @dataclass
    class Config:
        type: str = "single_stream"
        transformer: TransformerConfig = field(default_factory=TransformerConfig)
        #: BERT pooler (Linear + tanh) on the first token for ``pooled["joint"]``
        pooler: bool = True
        #: pooling of each modality's own ``pooled[m]``: first | mean
        modality_pooling: str = "mean"

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        self.cfg = cfg
        self.stack = TransformerStack(width, cfg.transformer)
        self.pooler = nn.Sequential(nn.Linear(width, width), nn.Tanh()) if cfg.pooler else None
        init_weights(self)

    def forward(self, tokens: dict[str, ModalityTokens]) -> FusionOutput:
        names = list(tokens)
        sizes = [tokens[m].tokens.shape[1] for m in names]
        x_BND = torch.cat([tokens[m].tokens for m in names], dim=1)
        mask_BN = torch.cat([tokens[m].mask for m in names], dim=1)
        x_BND = self.stack(x_BND, mask_BN)
        hidden = dict(zip(names, torch.split(x_BND, sizes, dim=1)))
        mask = {m: tokens[m].mask for m in names}
        pooled = {m: pool(hidden[m], mask[m], self.cfg.modality_pooling) for m in names}
        first_BD = x_BND[:, 0]
        pooled["joint"] = self.pooler(first_BD) if self.pooler is not None else first_BD
        return FusionOutput(hidden, mask, pooled)
