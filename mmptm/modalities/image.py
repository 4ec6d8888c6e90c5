"""The image plug-in: a ``jpg``/``png``/``webp`` member → normalised ``pixels [B,3,H,W]``.

Size, mean and std are facts the image encoder declares (timm's ``resolve_data_config``), so
a recipe states them once, on the encoder. Training may add a random resized crop
(``crop_scale``), drawn from the sample's seeded generator.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from PIL import Image

from mmptm.modalities.base import DataContext, Modality, Sample, find_member
from mmptm.registry import MODALITIES

_RESAMPLE = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR, "nearest": Image.NEAREST}


@MODALITIES.register("image")
class ImageData(Modality):
    """Decoded, resized and normalised images (one per sample)."""

    members: ClassVar[tuple[str, ...]] = ("jpg", "jpeg", "png", "webp")
    keys: ClassVar[tuple[str, ...]] = ("pixels",)

    @dataclass
    class Config:
        type: str = "image"
        #: side of the square input (declared by the image encoder)
        size: int = 0
        #: per-channel normalisation (declared by the image encoder)
        mean: list[float] = field(default_factory=list)
        std: list[float] = field(default_factory=list)
        interpolation: str = "bicubic"
        #: training only: a random crop of this fraction range of the area (aspect ratio
        #: 3/4..4/3), resized back to ``size``; [1, 1] = no crop
        crop_scale: list[float] = field(default_factory=lambda: [1.0, 1.0])

    def __init__(self, cfg: Config, *, views: Sequence[str], context: DataContext) -> None:
        super().__init__(cfg, views=views, context=context)
        where = "data.modalities.image"
        if cfg.size < 1:
            raise ValueError(f"{where}.size is unset: no encoder declared the image size")
        if len(cfg.mean) != 3 or len(cfg.std) != 3 or min(cfg.std) <= 0:
            raise ValueError(f"{where}: mean and std need 3 values (std > 0), got {cfg}")
        if cfg.interpolation not in _RESAMPLE:
            raise ValueError(f"{where}.interpolation must be one of {sorted(_RESAMPLE)}")
        scale = cfg.crop_scale
        if len(scale) != 2 or not 0.0 < scale[0] <= scale[1] <= 1.0:
            raise ValueError(f"{where}.crop_scale must be [min, max] in (0, 1], got {scale}")
        self.cropping = scale[0] < 1.0
        boxes = [v for v, need in context.needs.items() if need.modality == "regions"]
        if self.cropping and boxes:  # region boxes are relative to the whole image
            raise ValueError(f"{where}.crop_scale would move the region boxes of {boxes}")
        self.mean_C11 = torch.tensor(cfg.mean).view(3, 1, 1)
        self.std_C11 = torch.tensor(cfg.std).view(3, 1, 1)

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        ext = find_member(sample, self.members)
        if ext is None:
            raise ValueError(f"no image member (one of {self.members}); has {sorted(sample)}")
        size = self.cfg.size
        with Image.open(io.BytesIO(sample[ext])) as img:
            img.load()  # decode now, so a truncated file fails here
            img = img.convert("RGB")
            if img.size != (size, size):
                img = img.resize((size, size), _RESAMPLE[self.cfg.interpolation])
            x_HWC = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x_CHW = x_HWC.view(size, size, 3).permute(2, 0, 1).float() / 255.0
        return {self.prefix(self.views[0]) + "pixels": (x_CHW - self.mean_C11) / self.std_C11}

    def augment(self, item: Sample, rng: random.Random) -> Sample:
        if not self.cropping:
            return item
        key = self.prefix(self.views[0]) + "pixels"
        x_CHW = item[key]
        _, H, W = x_CHW.shape
        top, left, h, w = _crop_box(H, W, self.cfg.crop_scale, rng)
        crop_1CHW = x_CHW[None, :, top : top + h, left : left + w]
        mode = "bicubic" if self.cfg.interpolation == "bicubic" else "bilinear"
        item[key] = F.interpolate(crop_1CHW, size=(H, W), mode=mode, antialias=True)[0]
        return item

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        key = self.prefix(self.views[0]) + "pixels"
        return {key: torch.stack([s[key] for s in samples])}


def _crop_box(
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
