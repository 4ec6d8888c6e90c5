"""timm backbones for the image, region and video encoders: configure, build, load local
weights, freeze.

:class:`BackboneConfig` is the ``backbone:`` block of every encoder that wraps an image
backbone (``timm_image``, ``roi_regions``, ``video_frames``; ``video_backbone`` names a
torchvision video network the same way). Nothing is downloaded: weights come from a local
file (``.safetensors`` or a torch pickle).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch
from timm.data import resolve_data_config
from torch import nn


@dataclass
class BackboneConfig:
    """The backbone an encoder wraps, and the images it takes: the ``size``, ``mean`` and
    ``std`` the encoder declares to the image or video plug-in (``data_needs``)."""

    #: a timm model name, e.g. test_resnet (timm's tiny test network), vit_base_patch16_224
    model_name: str = "test_resnet"
    #: passed to timm.create_model, e.g. {img_size: 64, patch_size: 8, depth: 0}
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    #: local weights file for the backbone (never downloaded)
    weights: str | None = None
    #: side of the square input images
    image_size: int = 64
    #: input normalisation; None = what the timm model's pretrained config says
    mean: list[float] | None = None
    std: list[float] | None = None
    #: no gradients into the backbone (a frozen feature extractor)
    freeze: bool = False


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


def create_backbone(
    model_name: str,
    model_kwargs: Mapping[str, Any] | None = None,
    *,
    weights: str | Path | None = None,
    freeze: bool = False,
    **timm_kwargs: Any,
) -> nn.Module:
    """``timm.create_model(model_name, pretrained=False, **timm_kwargs, **model_kwargs)``.

    ``model_kwargs`` come from the config, ``timm_kwargs`` from the encoder (``num_classes=0``,
    ``features_only=True``). timm's construction errors become a one-line ValueError naming
    the model and its arguments; ``weights`` (a local file) is loaded with
    :func:`load_backbone_weights`; ``freeze`` turns off the backbone's gradients.
    """
    model_kwargs = dict(model_kwargs or {})
    try:  # a `pretrained` in model_kwargs collides with pretrained=False: a TypeError
        backbone = timm.create_model(model_name, pretrained=False, **timm_kwargs, **model_kwargs)
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        args = ", ".join(f"{k}={v!r}" for k, v in {**timm_kwargs, **model_kwargs}.items())
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ValueError(
            f"timm could not build {model_name!r}"
            + (f" with {args}" if args else "")
            + f": {reason}"
        ) from e
    if weights:
        load_backbone_weights(backbone, weights, model_name)
    if freeze:
        backbone.requires_grad_(False)
    return backbone


def timm_backbone(cfg: BackboneConfig, **timm_kwargs: Any) -> nn.Module:
    """The timm model ``cfg`` names, its weights loaded and frozen as ``cfg`` says
    (:func:`create_backbone`; ``timm_kwargs`` come from the encoder)."""
    return create_backbone(
        cfg.model_name, cfg.model_kwargs, weights=cfg.weights, freeze=cfg.freeze, **timm_kwargs
    )


def input_facts(backbone: nn.Module, cfg: BackboneConfig) -> dict[str, Any]:
    """What the image plug-in must give this backbone: size, and the mean and std its weights
    expect (timm's ``resolve_data_config``, unless the recipe names them)."""
    resolved = resolve_data_config({}, model=backbone)
    mean = cfg.mean if cfg.mean is not None else resolved["mean"]
    std = cfg.std if cfg.std is not None else resolved["std"]
    return {
        "size": cfg.image_size,
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
    }
