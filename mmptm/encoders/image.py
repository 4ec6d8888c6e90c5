"""Image patches through any timm backbone, projected to the fusion width.

Legend: B batch, C backbone channels, h×w feature grid, N tokens, D fusion width.
CNN feature maps [B,C,h,w] become h·w tokens; ViT-style outputs [B,N,C] are used as they are;
``output: pooled`` gives one token, the backbone's own pooled features (timm's
``forward_head(pre_logits=True)``: e.g. a CLIP ResNet's attention pool). The tokens are then
projected to D and normalised (``Linear`` + ``LayerNorm``), unless ``projection`` /
``norm`` are off: an imported CLIP ViT's tokens already are what its towers compare.
Nothing is downloaded: ``backbone.weights`` names a local checkpoint file (timm/open_clip
style state dict, ``.safetensors`` or a torch pickle).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from mmptm.encoders.backbone import BackboneConfig, input_facts, timm_backbone
from mmptm.encoders.base import Encoder, ModalityTokens, init_weights
from mmptm.modalities.base import Need
from mmptm.registry import ENCODERS

#: what ``timm_image`` gives as tokens
OUTPUTS = ("tokens", "pooled")


@ENCODERS.register("timm_image")
class TimmImageEncoder(Encoder):
    """Wraps the timm model its ``backbone`` names; reads ``pixels [B,3,H,W]``."""

    modality = "image"
    main_key = "pixels"

    @dataclass
    class Config:
        type: str = "timm_image"
        #: the timm model, its weights, and the image size, mean and std it takes
        backbone: BackboneConfig = field(default_factory=BackboneConfig)
        #: learned position embedding on the token grid (CNN grids have none of their own)
        position_embedding: bool = True
        #: tokens (the feature grid / ViT tokens) | pooled (the backbone's pooled features,
        #: one token)
        output: str = "tokens"
        #: a Linear from the backbone's channels to the encoder width; false = none (the
        #: channels must equal the width)
        projection: bool = True
        #: LayerNorm after the projection
        norm: bool = True
        #: how the image plug-in fits images to ``backbone.image_size`` (squash | shortest, see
        #: ``data.modalities.image.resize_mode``); None = the plug-in's own setting
        resize_mode: str | None = None

    def __init__(self, cfg: Config, *, width: int, name: str = "image", **_: object) -> None:
        super().__init__(width, name)
        if cfg.output not in OUTPUTS:
            raise ValueError(f"timm_image output {cfg.output!r}: choices are {OUTPUTS}")
        self.cfg = cfg
        self.backbone = timm_backbone(cfg.backbone, num_classes=0)
        size = cfg.backbone.image_size
        with torch.no_grad():  # probe the token grid once
            was_training = self.backbone.training
            self.backbone.eval()
            probe = self._features(torch.zeros(1, 3, size, size))
            self.backbone.train(was_training)
        n_tokens, channels = probe.shape[1], probe.shape[2]
        self.n_tokens = n_tokens
        if not cfg.projection and channels != width:
            raise ValueError(
                f"encoder {name!r}: projection=false needs the backbone's {channels} channels "
                f"to equal the encoder width {width}"
            )
        self.proj = nn.Linear(channels, width) if cfg.projection else nn.Identity()
        self.norm = nn.LayerNorm(width) if cfg.norm else nn.Identity()
        self.pos = nn.Parameter(torch.zeros(n_tokens, width)) if cfg.position_embedding else None
        init_weights(self.proj)
        if self.pos is not None:
            nn.init.normal_(self.pos, std=0.02)

    def data_needs(self) -> dict[str, Need]:
        facts = input_facts(self.backbone, self.cfg.backbone)
        if self.cfg.resize_mode is not None:
            facts["resize_mode"] = self.cfg.resize_mode
        return {self.view: Need(self.modality, facts)}

    def _features(self, pixels_BCHW: torch.Tensor) -> torch.Tensor:
        f = self.backbone.forward_features(pixels_BCHW)
        if self.cfg.output == "pooled":  # [B,C] -> one token [B,1,C]
            return self.backbone.forward_head(f, pre_logits=True)[:, None]
        if f.ndim == 4:  # CNN map [B,C,h,w] -> tokens [B,h*w,C]
            return f.flatten(2).transpose(1, 2)
        if f.ndim == 3:  # ViT-style [B,N,C]
            return f
        raise ValueError(
            f"{self.cfg.backbone.model_name}: unsupported feature shape {tuple(f.shape)}"
        )

    def forward(self, batch: dict) -> ModalityTokens:
        pixels = batch[self.input_key]
        size = self.cfg.backbone.image_size
        if pixels.shape[-2:] != (size, size):
            raise ValueError(
                f"{self.input_key} are {tuple(pixels.shape[-2:])}, encoder {self.view!r} "
                f"expects backbone.image_size={size}"
            )
        f_BNC = self._features(pixels)
        x_BND = self.norm(self.proj(f_BNC))
        if self.pos is not None:
            x_BND = x_BND + self.pos
        mask_BN = torch.ones(x_BND.shape[:2], dtype=torch.bool, device=x_BND.device)
        return ModalityTokens(self.add_type(x_BND), mask_BN)
