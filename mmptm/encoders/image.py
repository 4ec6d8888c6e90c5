"""Image patches through any timm backbone, projected to the fusion width.

Legend: B batch, C backbone channels, h×w feature grid, N tokens, D fusion width.
CNN feature maps [B,C,h,w] become h·w tokens; ViT-style outputs [B,N,C] are used as they are.
Nothing is downloaded: ``weights`` names a local checkpoint file (timm/open_clip style
state dict, ``.safetensors`` or a torch pickle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from mmptm.encoders.base import Encoder, ModalityTokens, init_weights
from mmptm.registry import ENCODERS


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict from ``.safetensors`` or a torch checkpoint, unwrapping common nests."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        sd: Any = load_file(str(path))
    else:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model", "module"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict):
        raise ValueError(f"{path}: expected a state dict, got {type(sd).__name__}")
    return {k.removeprefix("module."): v for k, v in sd.items()}


def load_backbone_weights(backbone: nn.Module, path: str | Path, model_name: str) -> None:
    """Load a full-model checkpoint into a timm backbone; keys it lacks (heads) are ignored.

    Raises ValueError naming the file on a shape mismatch or a missing key.
    """
    sd = load_state_dict_file(path)
    own = backbone.state_dict()
    wrong = [
        f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}"
        for k, v in sd.items()
        if k in own and v.shape != own[k].shape
    ]
    if wrong:
        raise ValueError(
            f"{path}: weights do not fit {model_name!r}; {len(wrong)} tensors "
            f"differ in shape (file vs model), e.g. {wrong[:3]}"
        )
    missing = [k for k in own if k not in sd]
    if missing:
        raise ValueError(
            f"{path}: weights do not fit {model_name!r}; missing "
            f"{len(missing)} keys, e.g. {missing[:5]}"
        )
    backbone.load_state_dict({k: sd[k] for k in own})


@ENCODERS.register("timm_image")
class TimmImageEncoder(Encoder):
    """Wraps ``timm.create_model(model_name, **model_kwargs)``; reads ``pixels [B,3,H,W]``."""

    kind = "image"

    input_key = "pixels"

    @dataclass
    class Config:
        type: str = "timm_image"
        model_name: str = "test_resnet"
        #: passed to timm.create_model, e.g. {img_size: 64, patch_size: 8, depth: 0}
        model_kwargs: dict[str, Any] = field(default_factory=dict)
        #: local weights file for the backbone (never downloaded)
        weights: str | None = None
        image_size: int = 64
        #: learned position embedding on the token grid (CNN grids have none of their own)
        position_embedding: bool = True
        freeze_backbone: bool = False

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__(width)
        self.cfg = cfg
        try:
            self.backbone = timm.create_model(
                cfg.model_name, pretrained=False, num_classes=0, **cfg.model_kwargs
            )
        except (RuntimeError, TypeError, ValueError) as e:
            raise ValueError(f"timm could not build {cfg.model_name!r}: {e}") from e
        if cfg.weights:
            self.load_backbone_weights(cfg.weights)
        if cfg.freeze_backbone:
            self.backbone.requires_grad_(False)
        with torch.no_grad():  # probe the token grid once
            was_training = self.backbone.training
            self.backbone.eval()
            probe = self._features(torch.zeros(1, 3, cfg.image_size, cfg.image_size))
            self.backbone.train(was_training)
        n_tokens, channels = probe.shape[1], probe.shape[2]
        self.n_tokens = n_tokens
        self.proj = nn.Linear(channels, width)
        self.norm = nn.LayerNorm(width)
        self.pos = nn.Parameter(torch.zeros(n_tokens, width)) if cfg.position_embedding else None
        init_weights(self.proj)
        if self.pos is not None:
            nn.init.normal_(self.pos, std=0.02)

    def load_backbone_weights(self, path: str | Path) -> None:
        load_backbone_weights(self.backbone, path, self.cfg.model_name)

    def _features(self, pixels_BCHW: torch.Tensor) -> torch.Tensor:
        f = self.backbone.forward_features(pixels_BCHW)
        if f.ndim == 4:  # CNN map [B,C,h,w] -> tokens [B,h*w,C]
            return f.flatten(2).transpose(1, 2)
        if f.ndim == 3:  # ViT-style [B,N,C]
            return f
        raise ValueError(f"{self.cfg.model_name}: unsupported feature shape {tuple(f.shape)}")

    def forward(self, batch: dict) -> ModalityTokens:
        pixels = batch["pixels"]
        if pixels.shape[-1] != self.cfg.image_size or pixels.shape[-2] != self.cfg.image_size:
            raise ValueError(
                f"pixels are {tuple(pixels.shape[-2:])}, encoder expects image_size="
                f"{self.cfg.image_size} (data.image_size and the encoder must agree)"
            )
        f_BNC = self._features(pixels)
        x_BND = self.norm(self.proj(f_BNC))
        if self.pos is not None:
            x_BND = x_BND + self.pos
        mask_BN = torch.ones(x_BND.shape[:2], dtype=torch.bool, device=x_BND.device)
        return ModalityTokens(self.add_type(x_BND), mask_BN)
