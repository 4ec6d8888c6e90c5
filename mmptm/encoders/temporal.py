"""What the encoders of sequences over time share: step masks and the temporal stage.

:class:`TemporalStage` is the part of the frames, video-backbone, features, units and
spectrogram encoders that makes a sequence of per-step tokens a model over time: a learned
[MASK] embedding at the steps an objective masks, zero-initialised temporal positions and
optional Transformer layers over time.

Legend: B batch, T time steps, P tokens per step, D width.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mmptm.encoders.base import init_weights
from mmptm.layers import TransformerConfig, TransformerStack


def frame_mask(batch: dict, key: str, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """The bool [B,T] mask under ``key``; every frame real when the batch has none."""
    mask_BT = batch.get(key)
    if mask_BT is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    return mask_BT.bool()


def no_empty_rows(real_BT: torch.Tensor) -> torch.Tensor:
    """Attention keys [B,T]: the real steps, and step 0 of a row that has none.

    A row without any real step would leave attention nothing to attend to (NaN).
    """
    first_T = torch.arange(real_BT.shape[1], device=real_BT.device) == 0
    return real_BT | (~real_BT.any(dim=1, keepdim=True) & first_T)


class TemporalStage(nn.Module):
    """[MASK] replacement, zero-initialised temporal positions, optional Transformer over time.

    Input ``x_BTPD``: P tokens per time step (P = 1 for one token per frame); the same
    temporal position is added to all P.
    """

    def __init__(
        self,
        width: int,
        *,
        max_frames: int,
        layers: int,
        heads: int,
        dropout: float,
        mask_embedding: bool = True,
        masked_key: str = "",
        pos_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        if layers < 0:
            raise ValueError(f"temporal_layers must be >= 0, got {layers}")
        self.max_frames = max_frames
        self.masked_key = masked_key
        self.mask_embedding: nn.Parameter | None = None
        if mask_embedding:
            self.mask_embedding = nn.Parameter(torch.empty(width).normal_(std=0.02))
        # Zero: with no temporal layers the encoder is a bag of frames at initialisation.
        # The tokens it is added to are layer-normed (about 1 per channel) while an optimiser
        # moves a zero-initialised table by about lr per step, so order would take hundreds
        # of steps to register; ``pos_scale`` multiplies the table (its effective step).
        self.pos = nn.Parameter(torch.zeros(max_frames, width))
        self.pos_scale = pos_scale
        cfg = TransformerConfig(layers=layers, heads=heads, dropout=dropout, attn_dropout=dropout)
        self.stack = TransformerStack(width, cfg) if layers > 0 else None
        if self.stack is not None:
            init_weights(self.stack)

    @classmethod
    def of(cls, cfg: Any, width: int, masked_key: str) -> TemporalStage:
        """The stage an encoder config describes (``max_frames``, ``temporal_layers``,
        ``temporal_heads``, ``temporal_pos_scale``, ``dropout``, ``mask_embedding``)."""
        return cls(
            width,
            max_frames=cfg.max_frames,
            layers=cfg.temporal_layers,
            heads=cfg.temporal_heads,
            dropout=cfg.dropout,
            mask_embedding=cfg.mask_embedding,
            masked_key=masked_key,
            pos_scale=cfg.temporal_pos_scale,
        )

    def forward(
        self, x_BTPD: torch.Tensor, real_BT: torch.Tensor, masked_BT: torch.Tensor | None
    ) -> torch.Tensor:
        B, T, P, D = x_BTPD.shape
        if T > self.max_frames:
            raise ValueError(f"clips of {T} frames exceed max_frames={self.max_frames}")
        if masked_BT is not None:
            if self.mask_embedding is None:
                raise ValueError(
                    f"the batch masks positions ({self.masked_key}) but this encoder has no "
                    "[MASK] embedding: set mask_embedding: true in its config"
                )
            if masked_BT.shape != (B, T):
                raise ValueError(f"masked positions are {tuple(masked_BT.shape)}, tokens {(B, T)}")
            replace_BT11 = (masked_BT.bool() & real_BT)[:, :, None, None]
            x_BTPD = torch.where(replace_BT11, self.mask_embedding.to(x_BTPD.dtype), x_BTPD)
        x_BTPD = x_BTPD + self.pos_scale * self.pos[:T, None, :]
        if self.stack is None:
            return x_BTPD
        keys_BT = no_empty_rows(real_BT)
        x_NTD = x_BTPD.transpose(1, 2).reshape(B * P, T, D)  # one sequence per spatial position
        keys_NT = keys_BT.repeat_interleave(P, dim=0)
        x_NTD = self.stack(x_NTD, keys_NT)
        return x_NTD.view(B, P, T, D).transpose(1, 2)
