"""A frozen, seeded "detector": per-object boxes, RoI features and class distributions.

What a bottom-up-attention model would report for each object, written as ``regions.npz``
by the ``regions`` and ``vqa`` views.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image

from mmptm.modalities.regions import regions_npz_bytes
from mmptm.toyworld.scene import BACKGROUND, SHAPES, Scene, _jpegs, object_box

DETECTOR_SEED = 0  # one fixed "detector" for every data seed, as in practice
DETECTOR_FEATURES = 64
_ROI_SIZE = 16  # each box is cropped and resized to this many pixels a side
_FEATURE_STEP = 2.0**-16  # features are rounded to this grid, see roi_features
_PROB_MARGIN = 3.0  # logit bonus of the true shape
_PROB_NOISE = 1.0  # std of the logit noise: the arg-max is wrong for ~7% of objects
_DETECTOR_STREAM = 3  # extra entropy word, as for NLI: new streams never shift old ones


@lru_cache(maxsize=1)
def _cnn_weights() -> tuple[np.ndarray, ...]:
    """He-initialised 3x3 kernels of a 3-layer CNN (3 -> 16 -> 32 -> 64), never trained."""
    rng = np.random.default_rng([DETECTOR_SEED, _DETECTOR_STREAM])
    widths = (3, 16, 32, DETECTOR_FEATURES)
    return tuple(
        rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (9 * cin))
        for cin, cout in itertools.pairwise(widths)
    )


def roi_features(images: np.ndarray, boxes: Sequence[np.ndarray]) -> list[np.ndarray]:
    """RoI features [R_i, DETECTOR_FEATURES] of uint8 images [B,H,W,3] and normalised boxes.

    Each box is cropped with ``roi_align`` to 16x16 pixels and passed through a frozen,
    seeded CNN (3x3 conv + ReLU, strides 2, 2, 1) and global average pooling. Computed in
    float64 and rounded to a 2**-16 grid: summation order (batch size, threads, CPU kernels)
    moves float64 results far less than the grid step, so the bytes do not depend on it.
    """
    import torch  # lazily: the text-only views do not need torch
    from torch.nn.functional import conv2d
    from torchvision.ops import roi_align

    counts = [len(b) for b in boxes]
    if not sum(counts):
        return [np.zeros((0, DETECTOR_FEATURES), np.float32) for _ in boxes]
    _, h, w, _ = images.shape
    pixels = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).double()
    pixels = (pixels / 255 - 0.5) / 0.25
    scale = np.array([w, h, w, h], np.float64)
    rois = np.concatenate(
        [np.c_[np.full(len(b), i), np.asarray(b, np.float64) * scale] for i, b in enumerate(boxes)]
    )
    with torch.no_grad():
        x = roi_align(pixels, torch.from_numpy(rois), _ROI_SIZE, 1.0, 2, aligned=True)
        for kernel, stride in zip(_cnn_weights(), (2, 2, 1)):
            x = torch.relu(conv2d(x, torch.from_numpy(kernel), stride=stride, padding=1))
        feats = x.mean((2, 3)).numpy()
    feats = (np.round(feats / _FEATURE_STEP) * _FEATURE_STEP).astype(np.float32)
    return np.split(feats, np.cumsum(counts)[:-1])


def _class_probs(scene: Scene) -> np.ndarray:
    """A noisy detector's distribution over SHAPES per object: softmax(3 one-hot + noise)."""
    rng = np.random.default_rng([*scene.entropy, _DETECTOR_STREAM])
    labels = [SHAPES.index(o.shape) for o in scene.objects]
    logits = _PROB_MARGIN * np.eye(len(SHAPES))[labels]
    logits = logits + _PROB_NOISE * rng.standard_normal(logits.shape)
    e = np.exp(logits - logits.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)).astype(np.float32)


def detect(scenes: Sequence[Scene], image_size: int) -> list[dict[str, Any]]:
    """What a detector reports per scene, as ``regions.npz`` records (plus the ``jpg``).

    One region per object, in the scene's (left to right) order: ``boxes`` = the objects'
    normalised boxes, ``features`` = :func:`roi_features` of the JPEG the samples carry,
    ``probs`` over SHAPES (the true shape gets most mass, not always the most), ``labels`` =
    the true shape ids, ``image_size`` = (w, h). Colour is not a detector class: it is left
    for the features to carry.
    """
    jpgs = _jpegs(tuple(scenes), image_size)
    boxes = [np.array([object_box(o) for o in s.objects], np.float32) for s in scenes]
    records = []
    chunk = 500  # bounds memory; roi_features' results do not depend on the chunking
    for start in range(0, len(scenes), chunk):
        part = slice(start, start + chunk)
        images = np.stack(
            [np.asarray(Image.open(io.BytesIO(j)).convert("RGB")) for j in jpgs[part]]
        )
        for scene, jpg, box, feats in zip(
            scenes[part], jpgs[part], boxes[part], roi_features(images, boxes[part])
        ):
            records.append(
                {
                    "jpg": jpg,
                    "features": feats,
                    "boxes": box,
                    "image_size": np.array([image_size, image_size], np.int32),
                    "probs": _class_probs(scene),
                    "labels": np.array([SHAPES.index(o.shape) for o in scene.objects], np.int64),
                }
            )
    return records


@lru_cache(maxsize=1)
def _detections(scenes: tuple[Scene, ...], image_size: int) -> tuple[tuple[bytes, bytes], ...]:
    """(jpg, regions.npz) per scene; cached because the regions and vqa views both need them."""
    return tuple((r["jpg"], regions_npz_bytes(r)) for r in detect(scenes, image_size))


# ---------------------------------------------------------------------------------------------
# Whole frames (the video_features view)

FRAME_FEATURES = 256
_FRAME_GRID = 4  # the CNN's map is average-pooled over a 4x4 grid of cells
_FRAME_STREAM = 8  # entropy word of the projection (with DETECTOR_SEED)


@lru_cache(maxsize=1)
def _frame_cnn() -> tuple[Any, ...]:
    """The CNN's kernels, then a fixed Gaussian map from the pooled grid (64 channels x 16
    cells) to FRAME_FEATURES, as float32 tensors."""
    import torch

    rng = np.random.default_rng([DETECTOR_SEED, _FRAME_STREAM])
    n_in = DETECTOR_FEATURES * _FRAME_GRID**2
    projection = rng.standard_normal((n_in, FRAME_FEATURES)) / np.sqrt(n_in)
    return tuple(torch.from_numpy(w).float() for w in (*_cnn_weights(), projection))


def frame_features(frames_THWC: np.ndarray) -> np.ndarray:
    """Per-frame features [T, FRAME_FEATURES] (float16) of uint8 frames [T,H,W,3].

    The RoI features' frozen CNN run over the whole frame minus the background colour (a still
    camera's background model: an empty frame gives zeros, and objects add to the features
    wherever they are, so a linear model can follow them), its map (64 channels at a quarter
    of the resolution) average-pooled over a 4x4 grid of cells, so what is drawn (colour,
    shape, size) and roughly where survive, then a fixed seeded Gaussian projection of the
    1024 pooled values to 256. Linear after the CNN: a linear model of the features is one of
    the pooled map. Computed in float32 (float64 would triple the video views' time), one clip
    at a time on one thread (see :func:`one_thread`), so the bytes depend neither on batching
    nor on threads; like the mp4 bytes, which embed the codec's version, they may differ in
    the last float16 bit on another CPU or torch build.
    H and W must be multiples of 16 (the map's side must split into 4 cells).
    """
    import torch  # lazily, as in roi_features
    from torch.nn.functional import avg_pool2d, conv2d

    frames = np.asarray(frames_THWC)
    t, h, w, _ = frames.shape
    if h % (4 * _FRAME_GRID) or w % (4 * _FRAME_GRID):
        raise ValueError(f"frame size must be a multiple of 16, got {h}x{w}")
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    x = (x - torch.tensor(BACKGROUND, dtype=torch.float32).view(1, 3, 1, 1)) / 64
    with one_thread(), torch.no_grad():
        for kernel, stride in zip(_frame_cnn(), (2, 2, 1)):
            x = torch.relu(conv2d(x, kernel, stride=stride, padding=1))
        cells = avg_pool2d(x, (x.shape[2] // _FRAME_GRID, x.shape[3] // _FRAME_GRID))
        feats = cells.reshape(t, -1) @ _frame_cnn()[-1]  # [T, 64 * 4 * 4] -> [T, F]
    return feats.numpy().astype(np.float16)


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread inside: the bytes of frame_features depend on no setting.

    For a few small frames a thread pool costs more than it brings (on a busy machine many
    times more); resizing the pool is not free either, so a loop over many clips should run
    inside one ``with one_thread():`` (nested ones do nothing).
    """
    import torch

    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads != 1:
            torch.set_num_threads(threads)
