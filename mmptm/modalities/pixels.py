"""Pixels shared by the image and video plug-ins (a clip is a stack of images): the image
members, resampling filters, the checks of their settings, normalisation and the random
resized crop.

Legend: N images, C channels, H×W size.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image

#: sample members that hold an image (the image plug-in; the video plug-in's 1-frame clips)
IMAGE_MEMBERS = ("jpg", "jpeg", "png", "webp", "gif")
#: PIL filter by ``interpolation`` setting (the image and video plug-ins)
RESAMPLE = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST}


def check_pixel_settings(cfg: Any, where: str, part: str) -> None:
    """Check ``size``, ``mean``/``std``, ``interpolation`` and ``crop_scale`` of a plug-in."""
    if cfg.size < 1:
        raise ValueError(f"{where}.size is unset: no encoder declared the {part} size")
    if len(cfg.mean) != 3 or len(cfg.std) != 3 or min(cfg.std) <= 0:
        raise ValueError(f"{where}: mean and std need 3 values (std > 0), got {cfg}")
    if cfg.interpolation not in RESAMPLE:
        raise ValueError(f"{where}.interpolation must be one of {sorted(RESAMPLE)}")
    scale = cfg.crop_scale
    if len(scale) != 2 or not 0.0 < scale[0] <= scale[1] <= 1.0:
        raise ValueError(f"{where}.crop_scale must be [min, max] in (0, 1], got {scale}")


def normalise(x_NHWC: torch.Tensor, mean_C11: torch.Tensor, std_C11: torch.Tensor) -> torch.Tensor:
    """uint8 RGB ``[..., H, W, 3]`` → float ``[..., 3, H, W]``, scaled to [0, 1] and normalised."""
    x_NCHW = x_NHWC.movedim(-1, -3).float() / 255.0
    return (x_NCHW - mean_C11) / std_C11


def random_resized_crop(
    x_NCHW: torch.Tensor, scale: Sequence[float], interpolation: str, rng: random.Random
) -> torch.Tensor:
    """One random crop (:func:`crop_box`) of all N images, resized back to H×W."""
    H, W = x_NCHW.shape[-2:]
    top, left, h, w = crop_box(H, W, scale, rng)
    crop_NChw = x_NCHW[..., top : top + h, left : left + w]
    mode = "bicubic" if interpolation == "bicubic" else "bilinear"
    return F.interpolate(crop_NChw, size=(H, W), mode=mode, antialias=True)


def crop_box(
    H: int, W: int, scale: Sequence[float], rng: random.Random
) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a random resized crop (Inception / torchvision style)."""
    for _ in range(10):
        area = H * W * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < w <= W and 0 < h <= H:
            return rng.randint(0, H - h), rng.randint(0, W - w), h, w
    return 0, 0, H, W
