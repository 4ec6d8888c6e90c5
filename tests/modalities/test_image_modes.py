"""Images of every mode (RGBA, LA, P, I;16, ...) and GIFs decode as open_clip preprocesses them."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from mmptm.data.pipeline import Loader, stream_config
from mmptm.data.shards import ShardWriter
from mmptm.modalities import DataContext, Need
from mmptm.modalities.image import ImageData
from mmptm.recipe import DataConfig

transform = pytest.importorskip("open_clip.transform")

SIZE, MEAN, STD = 24, [0.48, 0.46, 0.41], [0.27, 0.26, 0.28]


def _random(mode: str, size: tuple[int, int], seed: int = 0) -> Image.Image:
    """A noisy image in ``mode``: every channel random, so that any difference shows."""
    rng = np.random.default_rng(seed)
    w, h = size
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65536, (h, w), dtype=np.uint16))
    if mode in ("P", "P+transparency"):
        rgb = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
        return rgb.quantize(64)
    bands = len(Image.new(mode, (1, 1)).getbands())
    x = rng.integers(0, 256, (h, w, bands), dtype=np.uint8)
    return Image.fromarray(x[..., 0] if bands == 1 else x, mode)


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _members() -> dict[str, tuple[str, bytes]]:
    """name → (member extension, bytes) of each mode to check."""
    out = {}
    for mode in ("RGB", "L", "RGBA", "LA", "P", "I;16"):
        for size in ((53, 37), (13, 17)):  # downsampled and upsampled
            out[f"{mode} {size}"] = ("png", _encode(_random(mode, size), "PNG"))
    p = _random("P", (41, 29))
    out["P+transparency"] = ("png", _encode(p, "PNG", transparency=5))
    out["CMYK jpeg"] = ("jpg", _encode(_random("CMYK", (45, 31)), "JPEG", quality=95))
    frames = [_random("P", (37, 33), seed) for seed in range(3)]
    out["gif"] = ("gif", _encode(frames[0], "GIF"))
    out["animated gif"] = (
        "gif",
        _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=40),
    )
    return out


MEMBERS = _members()


def _plugin(resize_mode: str) -> ImageData:
    cfg = ImageData.Config(size=SIZE, mean=MEAN, std=STD, resize_mode=resize_mode)
    return ImageData(cfg, views=["image"], context=DataContext())


@pytest.mark.parametrize("resize_mode", ["shortest", "squash"])
@pytest.mark.parametrize("name", list(MEMBERS))
def test_every_mode_decodes_as_open_clip_preprocesses_it(name: str, resize_mode: str):
    ext, data = MEMBERS[name]
    preprocess = transform.image_transform(
        SIZE, is_train=False, mean=tuple(MEAN), std=tuple(STD), resize_mode=resize_mode
    )
    with Image.open(io.BytesIO(data)) as img:
        want = preprocess(img)
    got = _plugin(resize_mode).decode({ext: data}, {}, None)["pixels"]
    assert got.shape == want.shape == (3, SIZE, SIZE)
    assert (got - want).abs().max().item() <= 1e-6


def test_an_animated_gif_is_its_first_frame():
    _, animated = MEMBERS["animated gif"]
    plugin = _plugin("shortest")
    frames = []
    with Image.open(io.BytesIO(animated)) as img:
        assert img.n_frames == 3
        for i in range(3):
            img.seek(i)
            frames.append(plugin.decode({"png": _encode(img, "PNG")}, {}, None)["pixels"])
    got = plugin.decode({"gif": animated}, {}, None)["pixels"]
    assert torch.equal(got, frames[0])
    assert not torch.equal(got, frames[1]) and not torch.equal(got, frames[2])


def test_gif_members_pass_the_pipeline(tmp_path):
    assert "gif" in ImageData.members
    with ShardWriter(str(tmp_path / "g-%06d.tar"), 4) as w:
        for i in range(6):
            gif = _encode(_random("P", (20 + i, 18), seed=i), "GIF")
            w.write({"__key__": f"k{i}", "gif" if i != 2 else "png": gif[: 30 if i == 2 else None]})
    needs = {"image": Need("image", {"size": 16, "mean": MEAN, "std": STD})}
    cfg = DataConfig(train=",".join(w.shards), batch_size=3)
    sc = stream_config(cfg, None, needs=needs)
    sc = replace(sc, decoder=replace(sc.decoder, train=False), shuffle=False, drop_last=False)
    loader = Loader(sc, num_workers=0)
    batches = list(loader._epoch_batches())
    assert sorted(k for b in batches for k in b["__key__"]) == ["k0", "k1", "k3", "k4", "k5"]
    assert loader.skipped == 1  # only the truncated member
    assert all(b["pixels"].shape[1:] == (3, 16, 16) for b in batches)
