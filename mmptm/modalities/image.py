"""The image plug-in: a ``jpg``/``png``/``webp``/``gif`` member → normalised ``pixels [B,3,H,W]``.

Size, mean and std are facts the image encoder declares (timm's ``resolve_data_config``), so
a recipe states them once, on the encoder. An image is fitted to the square input whole
(``resize_mode: squash``) or, as open_clip and torchvision's evaluation transforms do, by its
shorter side and then centre-cropped (``shortest``). Training may add a random resized crop
(``crop_scale``), drawn from the sample's seeded generator.

Every mode is fitted in its own mode and only then converted to RGB, as open_clip's
preprocessing does (``Resize``, ``CenterCrop``, then ``convert("RGB")``), so that imported
CLIP weights see the pixels they were made for: PIL resizes ``RGBA`` / ``LA`` with
premultiplied alpha, palette (``P``) images by nearest neighbour, ``I;16`` at 16 bits. A
GIF is its first frame.
"""

from __future__ import annotations

import io
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from PIL import Image

from mmptm.modalities.base import DataContext, Modality, Sample, find_member
from mmptm.modalities.pixels import (
    IMAGE_MEMBERS,
    RESAMPLE,
    check_pixel_settings,
    normalise,
    random_resized_crop,
)
from mmptm.registry import MODALITIES

#: how an image is fitted to the square input
RESIZE_MODES = ("squash", "shortest")


@MODALITIES.register("image")
class ImageData(Modality):
    """Decoded, resized and normalised images (one per sample)."""

    members: ClassVar[tuple[str, ...]] = IMAGE_MEMBERS
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
        #: squash (the whole image to size × size) | shortest (the shorter side to size, then
        #: the centre size × size: open_clip's evaluation transform); declared by encoders
        #: whose weights expect one
        resize_mode: str = "squash"
        #: training only: a random crop of this fraction range of the area (aspect ratio
        #: 3/4..4/3), resized back to ``size``; [1, 1] = no crop
        crop_scale: list[float] = field(default_factory=lambda: [1.0, 1.0])

    def __init__(self, cfg: Config, *, views: Sequence[str], context: DataContext) -> None:
        super().__init__(cfg, views=views, context=context)
        where = "data.modalities.image"
        check_pixel_settings(cfg, where, "image")
        if cfg.resize_mode not in RESIZE_MODES:
            raise ValueError(f"{where}.resize_mode must be one of {RESIZE_MODES}")
        self.cropping = cfg.crop_scale[0] < 1.0
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
            img.load()  # decode now (a GIF: its first frame), so a truncated file fails here
            img = fit(img, size, self.cfg.resize_mode, self.cfg.interpolation).convert("RGB")
            x_HWC = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x_CHW = normalise(x_HWC.view(size, size, 3), self.mean_C11, self.std_C11)
        return {self.prefix(self.views[0]) + "pixels": x_CHW}

    def augment(self, item: Sample, rng: random.Random) -> Sample:
        if not self.cropping:
            return item
        key = self.prefix(self.views[0]) + "pixels"
        x_1CHW = item[key][None]
        item[key] = random_resized_crop(x_1CHW, self.cfg.crop_scale, self.cfg.interpolation, rng)[0]
        return item

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        key = self.prefix(self.views[0]) + "pixels"
        return {key: torch.stack([s[key] for s in samples])}

    @classmethod
    def preview(cls, sample: Sample, size: int) -> Image.Image | None:
        ext = find_member(sample, cls.members)
        if ext is None:
            return None
        try:
            with Image.open(io.BytesIO(sample[ext])) as img:
                img.draft("RGB", (size, size))  # JPEG: decode at a reduced scale, much faster
                picture = img.convert("RGB")
        except (OSError, Image.DecompressionBombError) as e:
            raise ValueError(f"{ext}: cannot decode the image: {e}") from None
        picture.thumbnail((size, size), Image.BICUBIC)
        return picture


def fit(img: Image.Image, size: int, mode: str, interpolation: str) -> Image.Image:
    """``img`` as size × size: squashed whole, or (``shortest``) resized by its shorter side
    and centre-cropped, with torchvision's rounding (``Resize(size)`` + ``CenterCrop(size)``)."""
    w, h = img.size
    if mode == "squash":
        new_w, new_h = size, size
    else:  # the longer side truncated, as torchvision's _compute_resized_output_size
        new_w, new_h = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    if (w, h) != (new_w, new_h):
        img = img.resize((new_w, new_h), RESAMPLE[interpolation])
    if (new_w, new_h) == (size, size):
        return img
    top, left = round((new_h - size) / 2.0), round((new_w - size) / 2.0)
    return img.crop((left, top, left + size, top + size))
