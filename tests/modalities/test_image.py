"""The image plug-in: decode at the declared size and normalisation, the training crop."""

from __future__ import annotations

import io
import random

import pytest
import torch
from PIL import Image

from mmptm.modalities import DataContext, Need
from mmptm.modalities.image import ImageData


def _png(size=(40, 24), color=(10, 200, 30), fmt="PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def _image(needs=None, **cfg) -> ImageData:
    settings = ImageData.Config(**{"size": 16, "mean": [0.5] * 3, "std": [0.25] * 3, **cfg})
    return ImageData(settings, views=["image"], context=DataContext(needs=needs or {}))


def test_decode_resizes_and_normalises_as_declared():
    out = _image().decode({"__key__": "k", "png": _png()}, {}, None)
    x = out["pixels"]
    assert x.shape == (3, 16, 16)
    want = (torch.tensor([10, 200, 30]) / 255.0 - 0.5) / 0.25  # a flat colour stays flat
    torch.testing.assert_close(x.mean(dim=(1, 2)), want, atol=0.02, rtol=0)


def test_the_first_image_member_by_extension_is_read_and_a_missing_one_named():
    sample = {
        "webp": _png(color=(255, 0, 0), fmt="WEBP"),
        "jpg": _png(color=(0, 0, 255), fmt="JPEG"),
    }
    x = _image().decode(sample, {}, None)["pixels"]
    assert x[2].mean() > x[0].mean()  # jpg comes first in the plug-in's member list: blue
    with pytest.raises(ValueError, match=r"no image member \(one of .*jpg.*\); has \['txt'\]"):
        _image().decode({"txt": b"x"}, {}, None)
    with pytest.raises(OSError):  # a truncated file fails at decode (skipped and counted)
        _image().decode({"png": _png()[:40]}, {}, None)


def test_crop_augmentation_is_seeded_and_changes_the_view():
    img = Image.new("RGB", (16, 16))
    img.paste((255, 255, 255), (0, 0, 8, 16))  # left half white, right half black
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    plugin = _image(crop_scale=[0.2, 0.4])
    item = plugin.decode({"png": buf.getvalue()}, {}, None)
    crops = [plugin.augment(dict(item), random.Random(i))["pixels"] for i in range(8)]
    assert all(c.shape == (3, 16, 16) for c in crops)
    again = plugin.augment(dict(item), random.Random(3))["pixels"]
    torch.testing.assert_close(again, crops[3])
    assert len({round(c.mean().item(), 4) for c in crops}) > 1  # different crops, different views
    assert not torch.equal(crops[0], item["pixels"])
    untouched = _image().augment(dict(item), random.Random(0))["pixels"]
    assert torch.equal(untouched, item["pixels"])  # crop_scale [1, 1]: no augmentation


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="crop_scale must be"):
        _image(crop_scale=[0.5])
    with pytest.raises(ValueError, match="mean and std need 3 values"):
        _image(std=[0.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="would move the region boxes"):
        _image(needs={"regions": Need("regions")}, crop_scale=[0.5, 1.0])


@pytest.mark.parametrize("size", [(40, 24), (24, 40), (33, 61), (17, 16), (16, 16), (9, 5)])
def test_shortest_resize_and_centre_crop_equal_torchvision(size):
    """``resize_mode: shortest`` is torchvision's Resize(size) + CenterCrop(size) (open_clip's
    evaluation transform), pixel for pixel."""
    from torchvision import transforms

    g = torch.Generator().manual_seed(sum(size))
    pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=g, dtype=torch.uint8)
    img = Image.fromarray(pixels.numpy())
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    plugin = _image(resize_mode="shortest")
    got = plugin.decode({"png": buf.getvalue()}, {}, None)["pixels"]
    tv = transforms.Compose(
        [
            transforms.Resize(16, interpolation=transforms.InterpolationMode.BICUBIC),
            transforms.CenterCrop(16),
            transforms.ToTensor(),
            transforms.Normalize([0.5] * 3, [0.25] * 3),
        ]
    )
    torch.testing.assert_close(got, tv(img), rtol=0, atol=0)
    with pytest.raises(ValueError, match="resize_mode must be one of"):
        _image(resize_mode="longest")
