"""Video clips as tokens: any timm image backbone applied frame by frame, then time.

``video_frames`` reads ``frames [B,T,3,H,W]`` and ``frames_mask [B,T]`` (True = real frame)
from the video plug-in. Every real frame goes through the backbone as an image
([B·T,3,H,W]; padding frames are skipped, so they neither cost compute nor enter BatchNorm
statistics), is projected to the fusion width, and then :class:`TemporalStage` adds what
makes it a video model:

- a temporal position embedding initialised to **zero**, so an image model starts out as a
  frame-averaging video model (Frozen-in-Time's initialisation);
- optional Transformer layers over time (``temporal_layers``; with patch tokens, attention
  runs over time separately at each spatial position), with padding frames masked;
- with ``mask_embedding: true``, a learned [MASK] embedding in place of the frames an
  objective's data side marks in ``<prefix>frames_masked [B,T]`` (the masked-position
  convention shared with the features and units encoders).

``tokens: frame`` gives one pooled backbone vector per frame (N = T); ``tokens: patch`` gives
every patch token of every frame (N = T·P, frame-major). An image is a 1-frame clip, so one
encoder trains on batches of images and batches of clips alike.

Legend: B batch, T frames, P patch tokens per frame, C backbone channels, D fusion width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from mmptm.encoders.backbone import create_backbone, input_facts
from mmptm.encoders.base import Encoder, ModalityTokens, init_weights
from mmptm.layers import TransformerConfig, TransformerStack
from mmptm.modalities.base import Need
from mmptm.registry import ENCODERS


def frame_mask(batch: dict, key: str, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """The bool [B,T] mask under ``key``; every frame real when the batch has none."""
    mask_BT = batch.get(key)
    if mask_BT is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    return mask_BT.bool()


class TemporalStage(nn.Module):
    """[MASK] replacement, zero-initialised temporal positions, optional Transformer over time.

    Shared by the frames, features and units encoders. Input ``x_BTPD``: P tokens per time
    step (P = 1 for one token per frame); the same temporal position is added to all P.
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
        # A row without any real frame would leave attention nothing to attend to (NaN).
        first_T = torch.arange(T, device=real_BT.device) == 0
        keys_BT = real_BT | (~real_BT.any(dim=1, keepdim=True) & first_T)
        x_NTD = x_BTPD.transpose(1, 2).reshape(B * P, T, D)  # one sequence per spatial position
        keys_NT = keys_BT.repeat_interleave(P, dim=0)
        x_NTD = self.stack(x_NTD, keys_NT)
        return x_NTD.view(B, P, T, D).transpose(1, 2)


@ENCODERS.register("video_frames")
class VideoFramesEncoder(Encoder):
    """A timm image backbone per frame + :class:`TemporalStage`; reads ``frames [B,T,3,H,W]``."""

    modality = "video"
    main_key = "frames"

    @dataclass
    class Config:
        type: str = "video_frames"
        model_name: str = "test_resnet"
        #: passed to timm.create_model, e.g. {img_size: 64, patch_size: 8, depth: 0}
        model_kwargs: dict[str, Any] = field(default_factory=dict)
        #: local weights file for the backbone (never downloaded)
        weights: str | None = None
        image_size: int = 64
        #: input normalisation; None = what the timm model's pretrained config says
        mean: list[float] | None = None
        std: list[float] | None = None
        freeze_backbone: bool = False
        #: frame: one vector per frame; patch: every patch token of every frame
        tokens: Literal["frame", "patch"] = "frame"
        #: how ``tokens: frame`` makes a frame's vector: ``pool`` (the backbone's own global
        #: pooling: what is there, not where) or ``grid`` (the feature map, or the patch
        #: tokens, concatenated: what is where, so motion is visible from frame to frame)
        frame_vector: Literal["pool", "grid"] = "pool"
        #: learned spatial position embedding on the patch grid (tokens: patch)
        position_embedding: bool = True
        #: rows of the temporal position table (the longest clip this encoder accepts)
        max_frames: int = 64
        #: Transformer layers over time (0 = none: frames meet only in the fusion module)
        temporal_layers: int = 0
        temporal_heads: int = 4
        #: multiplier of the (zero-initialised) temporal position table: its effective
        #: learning rate, against tokens that are layer-normed to about 1 per channel
        temporal_pos_scale: float = 16.0
        dropout: float = 0.0
        #: a learned [MASK] embedding for frames an objective masks (``frames_masked``)
        mask_embedding: bool = False

    def __init__(self, cfg: Config, *, width: int, name: str = "video", **_: object) -> None:
        super().__init__(width, name)
        self.cfg = cfg
        self.backbone = create_backbone(
            cfg.model_name,
            cfg.model_kwargs,
            weights=cfg.weights,
            freeze=cfg.freeze_backbone,
            num_classes=0,
        )
        with torch.no_grad():  # probe the token grid once
            was_training = self.backbone.training
            self.backbone.eval()
            probe = self._features(torch.zeros(1, 3, cfg.image_size, cfg.image_size))
            self.backbone.train(was_training)
        self.n_patches, channels = probe.shape[1], probe.shape[2]
        self.proj = nn.Linear(channels, width)
        self.norm = nn.LayerNorm(width)
        self.spatial_pos: nn.Parameter | None = None
        if cfg.tokens == "patch" and cfg.position_embedding:
            self.spatial_pos = nn.Parameter(torch.empty(self.n_patches, width).normal_(std=0.02))
        self.drop = nn.Dropout(cfg.dropout)
        self.temporal = TemporalStage.of(cfg, width, f"{self.prefix}frames_masked")
        init_weights(self.proj)

    def data_needs(self) -> dict[str, Need]:
        facts = input_facts(self.backbone, self.cfg.image_size, self.cfg.mean, self.cfg.std)
        return {self.view: Need(self.modality, facts)}

    def _features(self, pixels_NCHW: torch.Tensor) -> torch.Tensor:
        """Backbone output per image: [N,1,C] pooled (tokens: frame) or [N,P,C] patches."""
        if self.cfg.tokens == "frame" and self.cfg.frame_vector == "pool":
            return self.backbone(pixels_NCHW).unsqueeze(1)  # num_classes=0: pooled features
        f = self.backbone.forward_features(pixels_NCHW)
        if self.cfg.tokens == "frame":  # grid: [N,C,h,w] or [N,P,C] -> [N,1,C*h*w]
            return f.flatten(1).unsqueeze(1)
        if f.ndim == 4:  # CNN map [N,C,h,w] -> tokens [N,h*w,C]
            return f.flatten(2).transpose(1, 2)
        if f.ndim == 3:  # ViT-style [N,P,C]
            return f
        raise ValueError(f"{self.cfg.model_name}: unsupported feature shape {tuple(f.shape)}")

    def forward(self, batch: dict) -> ModalityTokens:
        frames_BTCHW = batch[self.input_key]
        if frames_BTCHW.ndim != 5:
            raise ValueError(
                f"{self.input_key} must be [B,T,3,H,W], got {tuple(frames_BTCHW.shape)}"
            )
        B, T = frames_BTCHW.shape[:2]
        size = self.cfg.image_size
        if frames_BTCHW.shape[-2:] != (size, size):
            raise ValueError(
                f"{self.input_key} frames are {tuple(frames_BTCHW.shape[-2:])}, encoder "
                f"{self.view!r} expects image_size={size}"
            )
        real_BT = frame_mask(batch, f"{self.input_key}_mask", (B, T), frames_BTCHW.device)
        # Only real frames go through the backbone; padding rows stay zero.
        real_N = real_BT.reshape(B * T)
        frames_NCHW = frames_BTCHW.reshape(B * T, *frames_BTCHW.shape[2:])
        if bool(real_N.all()):
            f_NPC = self._features(frames_NCHW)
        else:
            f_MPC = self._features(frames_NCHW[real_N])
            f_NPC = f_MPC.new_zeros(B * T, *f_MPC.shape[1:])
            f_NPC[real_N] = f_MPC
        x_NPD = self.norm(self.proj(f_NPC))
        if self.spatial_pos is not None:
            x_NPD = x_NPD + self.spatial_pos
        x_BTPD = self.drop(x_NPD.view(B, T, x_NPD.shape[1], self.width))
        x_BTPD = self.temporal(x_BTPD, real_BT, batch.get(f"{self.prefix}frames_masked"))
        P = x_BTPD.shape[2]
        x_BND = x_BTPD.reshape(B, T * P, self.width)  # frame-major: frame t is rows t·P..t·P+P-1
        mask_BN = real_BT.repeat_interleave(P, dim=1)
        return ModalityTokens(self.add_type(x_BND), mask_BN)
