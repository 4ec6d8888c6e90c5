"""Video clips as tokens: any timm image backbone applied frame by frame, then time.

``video_frames`` reads ``frames [B,T,3,H,W]`` and ``frames_mask [B,T]`` (True = real frame)
from the video plug-in. Every real frame goes through the backbone as an image
([B·T,3,H,W]; padding frames are skipped, so they neither cost compute nor enter BatchNorm
statistics), is projected to the fusion width, and then
:class:`~mmptm.encoders.temporal.TemporalStage` adds what makes it a video model:

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

``video_backbone`` reads the same ``frames`` but runs a torchvision video network over the
whole clip (R3D / MC3 / R(2+1)D / S3D 3D convolutions, Video Swin, MViT: time is mixed inside
the backbone), by name; its feature map pooled over space gives one token per output time
step (T' = T / the network's temporal stride), or one token per clip.

Legend: B batch, T frames, P patch tokens per frame, C backbone channels, D fusion width.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from mmptm.encoders.backbone import (
    BackboneConfig,
    input_facts,
    load_backbone_weights,
    timm_backbone,
)
from mmptm.encoders.base import Encoder, ModalityTokens, init_weights
from mmptm.encoders.temporal import TemporalStage, frame_mask
from mmptm.modalities.base import Need
from mmptm.registry import ENCODERS


@ENCODERS.register("video_frames")
class VideoFramesEncoder(Encoder):
    """A timm image backbone per frame + :class:`TemporalStage`; reads ``frames [B,T,3,H,W]``."""

    modality = "video"
    main_key = "frames"

    @dataclass
    class Config:
        type: str = "video_frames"
        #: the timm image model run on every frame, its weights, and the frame size, mean
        #: and std it takes
        backbone: BackboneConfig = field(default_factory=BackboneConfig)
        #: frame: one vector per frame; patch: every patch token of every frame
        tokens: Literal["frame", "patch"] = "frame"
        #: how ``tokens: frame`` makes a frame's vector: ``pool`` (the backbone's own global
        #: pooling: what is there, not where) or ``grid`` (the feature map, or the patch
        #: tokens, concatenated: what is where, so motion is visible from frame to frame)
        frame_vector: Literal["pool", "grid"] = "pool"
        #: normalisation after the projection: ``layer`` (per token) or ``batch`` (each
        #: channel over the batch's real frames, BatchNorm): a backbone without BatchNorm of
        #: its own (a ViT) gives every frame of a plain scene nearly the same vector, and
        #: removing the batch's shared part lets the contrastive loss see the differences
        proj_norm: Literal["layer", "batch"] = "layer"
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
        self.backbone = timm_backbone(cfg.backbone, num_classes=0)
        size = cfg.backbone.image_size
        with torch.no_grad():  # probe the token grid once
            was_training = self.backbone.training
            self.backbone.eval()
            probe = self._features(torch.zeros(1, 3, size, size))
            self.backbone.train(was_training)
        self.n_patches, channels = probe.shape[1], probe.shape[2]
        self.proj = nn.Linear(channels, width)
        self.norm = nn.LayerNorm(width) if cfg.proj_norm == "layer" else nn.BatchNorm1d(width)
        self.spatial_pos: nn.Parameter | None = None
        if cfg.tokens == "patch" and cfg.position_embedding:
            self.spatial_pos = nn.Parameter(torch.empty(self.n_patches, width).normal_(std=0.02))
        self.drop = nn.Dropout(cfg.dropout)
        self.temporal = TemporalStage.of(cfg, width, f"{self.prefix}frames_masked")
        init_weights(self.proj)

    def data_needs(self) -> dict[str, Need]:
        facts = input_facts(self.backbone, self.cfg.backbone)
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
        raise ValueError(
            f"{self.cfg.backbone.model_name}: unsupported feature shape {tuple(f.shape)}"
        )

    def _project(self, f_MPC: torch.Tensor) -> torch.Tensor:
        """Backbone features of real frames → normalised tokens [M,P,D]."""
        x_MPD = self.proj(f_MPC)
        if isinstance(self.norm, nn.BatchNorm1d):  # statistics over every real frame's tokens
            return self.norm(x_MPD.flatten(0, 1)).view(x_MPD.shape)
        return self.norm(x_MPD)

    def forward(self, batch: dict) -> ModalityTokens:
        frames_BTCHW = batch[self.input_key]
        if frames_BTCHW.ndim != 5:
            raise ValueError(
                f"{self.input_key} must be [B,T,3,H,W], got {tuple(frames_BTCHW.shape)}"
            )
        B, T = frames_BTCHW.shape[:2]
        size = self.cfg.backbone.image_size
        if frames_BTCHW.shape[-2:] != (size, size):
            raise ValueError(
                f"{self.input_key} frames are {tuple(frames_BTCHW.shape[-2:])}, encoder "
                f"{self.view!r} expects backbone.image_size={size}"
            )
        real_BT = frame_mask(batch, f"{self.input_key}_mask", (B, T), frames_BTCHW.device)
        # Only real frames go through the backbone; padding rows stay zero.
        real_N = real_BT.reshape(B * T)
        frames_NCHW = frames_BTCHW.reshape(B * T, *frames_BTCHW.shape[2:])
        if bool(real_N.all()):
            x_NPD = self._project(self._features(frames_NCHW))
        else:
            x_MPD = self._project(self._features(frames_NCHW[real_N]))
            x_NPD = x_MPD.new_zeros(B * T, *x_MPD.shape[1:])
            x_NPD[real_N] = x_MPD
        if self.spatial_pos is not None:
            x_NPD = x_NPD + self.spatial_pos
        x_BTPD = self.drop(x_NPD.view(B, T, x_NPD.shape[1], self.width))
        x_BTPD = self.temporal(x_BTPD, real_BT, batch.get(f"{self.prefix}frames_masked"))
        P = x_BTPD.shape[2]
        x_BND = x_BTPD.reshape(B, T * P, self.width)  # frame-major: frame t is rows t·P..t·P+P-1
        mask_BN = real_BT.repeat_interleave(P, dim=1)
        return ModalityTokens(self.add_type(x_BND), mask_BN)


#: torchvision's video networks (``torchvision.models.video``) and where their features are
#: read: ResNet-style 3D CNNs (stem + four stages), S3D (``features``), Video Swin
#: (patch embedding, stages, norm: channels last), MViT (its class token: one per clip)
_TV_FAMILIES = {
    "r3d_18": "resnet", "mc3_18": "resnet", "r2plus1d_18": "resnet", "s3d": "s3d",
    "swin3d_t": "swin", "swin3d_s": "swin", "swin3d_b": "swin",
    "mvit_v1_b": "mvit", "mvit_v2_s": "mvit",
}  # fmt: skip
#: the classifier each family's ``forward`` ends with, removed (never trained, never synced)
_TV_HEADS = {"resnet": "fc", "s3d": "classifier", "swin": "head", "mvit": "head"}
#: the Kinetics-400 normalisation torchvision's video weights were trained with
KINETICS_MEAN = [0.43216, 0.394666, 0.37645]
KINETICS_STD = [0.22803, 0.22145, 0.216989]


@dataclass
class VideoNetConfig(BackboneConfig):
    """``video_backbone``'s network: a torchvision video model, not a timm one.

    ``model_kwargs`` go to the torchvision builder; ``weights`` is a torchvision state dict
    file; ``mean`` / ``std`` None = Kinetics-400's, as torchvision's weights expect.
    """

    #: r3d_18, mc3_18, r2plus1d_18, s3d, swin3d_t/s/b, mvit_v1_b, mvit_v2_s
    model_name: str = "r3d_18"
    #: frames are resized to this square (torchvision's weights: 112 for the ResNets,
    #: 224 for S3D, Swin and MViT; MViT accepts only 16 frames of 224²)
    image_size: int = 112


@ENCODERS.register("video_backbone")
class VideoBackboneEncoder(Encoder):
    """A torchvision video network over the clip + :class:`TemporalStage` over its time steps.

    Reads ``frames [B,T,3,H,W]`` (given to the network as [B,3,T,H,W]). A 3D network cannot
    skip padding frames as ``video_frames`` does: they enter its convolutions (as the
    normalised mean colour, zeros), and an output step is masked when every frame under it
    is padding. Weights come from a local file (``backbone.weights``: a torchvision state
    dict, e.g. ``r3d_18-b3b3357e.pth``); the classifier is dropped.
    """

    modality = "video"
    main_key = "frames"

    @dataclass
    class Config:
        type: str = "video_backbone"
        #: the torchvision video network, its weights, and the frame size, mean and std it
        #: takes
        backbone: VideoNetConfig = field(default_factory=VideoNetConfig)
        #: time: one token per output time step; clip: one token (MViT: always)
        tokens: Literal["time", "clip"] = "time"
        max_frames: int = 64
        temporal_layers: int = 0
        temporal_heads: int = 4
        temporal_pos_scale: float = 16.0
        dropout: float = 0.0

    def __init__(self, cfg: Config, *, width: int, name: str = "video", **_: object) -> None:
        super().__init__(width, name)
        self.cfg = cfg
        b = cfg.backbone
        self.family = _TV_FAMILIES.get(b.model_name)
        if self.family is None:
            raise ValueError(
                f"video_backbone: unknown model_name {b.model_name!r}; torchvision's video "
                f"models are {sorted(_TV_FAMILIES)}"
            )
        if self.family == "mvit" and cfg.tokens != "clip":
            raise ValueError(f"{b.model_name} gives one vector per clip: set tokens: clip")
        try:
            net = torchvision.models.get_model(b.model_name, weights=None, **b.model_kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError(f"torchvision could not build {b.model_name!r}: {e}") from e
        head = getattr(net, _TV_HEADS[self.family])
        last = [m for m in head.modules() if isinstance(m, (nn.Linear, nn.Conv3d))][-1]
        channels = last.in_features if isinstance(last, nn.Linear) else last.in_channels
        setattr(net, _TV_HEADS[self.family], nn.Identity())
        if b.weights:
            load_backbone_weights(net, b.weights, b.model_name)
        if b.freeze:
            net.requires_grad_(False)
        self.backbone = net
        self.proj = nn.Linear(channels, width)
        init_weights(self.proj)
        self.norm = nn.LayerNorm(width)
        self.drop = nn.Dropout(cfg.dropout)
        self.temporal = TemporalStage(
            width, max_frames=cfg.max_frames, layers=cfg.temporal_layers,
            heads=cfg.temporal_heads, dropout=cfg.dropout, mask_embedding=False,
            pos_scale=cfg.temporal_pos_scale,
        )  # fmt: skip

    def data_needs(self) -> dict[str, Need]:
        b = self.cfg.backbone
        facts = {
            "size": b.image_size,
            "mean": [float(v) for v in (b.mean or KINETICS_MEAN)],
            "std": [float(v) for v in (b.std or KINETICS_STD)],
        }
        return {self.view: Need(self.modality, facts)}

    def _features(self, x_BCTHW: torch.Tensor) -> torch.Tensor:
        """The network's output as [B,T',C]: pooled over space (one step for MViT)."""
        net = self.backbone
        if self.family == "mvit":
            return net(x_BCTHW).unsqueeze(1)  # the class token after the final norm
        if self.family == "resnet":
            f = net.layer4(net.layer3(net.layer2(net.layer1(net.stem(x_BCTHW)))))
        elif self.family == "s3d":
            f = net.features(x_BCTHW)
        else:  # swin: channels last [B,T',H',W',C]
            f = net.norm(net.features(net.pos_drop(net.patch_embed(x_BCTHW))))
            f = f.permute(0, 4, 1, 2, 3)
        return f.mean(dim=(3, 4)).transpose(1, 2)  # [B,C,T',H',W'] -> [B,T',C]

    def forward(self, batch: dict) -> ModalityTokens:
        frames_BTCHW = batch[self.input_key]
        if frames_BTCHW.ndim != 5:
            raise ValueError(
                f"{self.input_key} must be [B,T,3,H,W], got {tuple(frames_BTCHW.shape)}"
            )
        B, T = frames_BTCHW.shape[:2]
        real_BT = frame_mask(batch, f"{self.input_key}_mask", (B, T), frames_BTCHW.device)
        f_BSC = self._features(frames_BTCHW.transpose(1, 2))
        if self.cfg.tokens == "clip" and f_BSC.shape[1] > 1:
            f_BSC = f_BSC.mean(dim=1, keepdim=True)
        S = f_BSC.shape[1]
        # an output step is real when any frame under it is (time strides split T evenly)
        real_BS = F.adaptive_max_pool1d(real_BT.float()[:, None], S)[:, 0] > 0
        x_BSD = self.drop(self.norm(self.proj(f_BSC)))
        x_BSD = self.temporal(x_BSD[:, :, None], real_BS, None)[:, :, 0]
        return ModalityTokens(self.add_type(x_BSD), real_BS)
