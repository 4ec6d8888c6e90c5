"""The scene model: labels and constants, scene sampling, layout geometry and rendering.

:func:`sample_scene` draws a layout (:class:`Scene` of :class:`Obj`) from its own seed words;
:func:`relation`, :func:`location` and :func:`object_box` read facts off it, and
:func:`render` / :func:`encode_jpeg` turn it into pixels.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw

# Bump whenever the same arguments would produce different bytes.
# 2: views mono and nli (image_text, parallel and text/ unchanged since 1).
# 3: views regions and vqa (the others unchanged since 2).
# 4: train splits of parallel and mono add statement samples (the others unchanged since 3).
# 5: view knowledge (opt-in; the others unchanged since 4).
# 6: image_text's json adds object_, pair_ and list_captions (its jpg and txt, and every
#    other view, unchanged since 5 but for the version the VQA files state).
GENERATOR_VERSION = 6

SPLITS = {"train": 0, "val": 1, "test": 2}
SHAPES = ("circle", "square", "triangle", "diamond", "star")
# Saturated and far apart in RGB, so a JPEG'd 64 px image still shows which is which.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 200, 20),
    "purple": (140, 40, 170),
    "orange": (245, 130, 20),
}
# Circumradius as a fraction of the image side; a 2x ratio is obvious whatever the shape.
SIZES: dict[str, float] = {"small": 0.07, "large": 0.14}
RELATIONS = ("left_of", "right_of", "above", "below")
# fmt: off
LOCATIONS = (  # the 3x3 grid, row by row
    "top_left", "top", "top_right",
    "left", "middle", "right",
    "bottom_left", "bottom", "bottom_right",
)
# fmt: on

BACKGROUND = (236, 236, 230)
NOISE = 5  # +- grey levels of per-pixel noise
JPEG_QUALITY = 90
N_OBJECTS_P = (0.1, 0.3, 0.3, 0.3)  # P(1..4 objects); few singles keeps captions unique
EDGE = 0.02  # min free border between a shape and the image edge
GAP = 0.06  # min free space between two shapes' circumcircles
DOMINANCE = 1.5  # a stated relation's axis offset is >= this times the other axis offset
GRID_MARGIN = 0.06  # a lone object stays this far from the 3x3 grid lines
SUPERSAMPLE = 4  # draw larger, then box-filter down: cheap anti-aliasing
_MAX_TRIES = 10_000
_RENDER_STREAM = 1  # extra entropy word: render noise never shifts the layout stream


def _unit(vertices: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Centre a polygon's bounding box on the origin and scale its circumradius to 1.

    Box centre == object centre, and every shape fits in its circle of radius ``r``.
    """
    v = np.asarray(vertices, dtype=np.float64)
    v = v - (v.min(0) + v.max(0)) / 2
    v = v / np.linalg.norm(v, axis=1).max()
    return tuple((float(x), float(y)) for x, y in v)


def _star(points: int = 5, inner: float = 0.45) -> list[tuple[float, float]]:
    angles = np.pi * np.arange(2 * points) / points - np.pi / 2
    radii = np.where(np.arange(2 * points) % 2 == 0, 1.0, inner)
    return list(zip(radii * np.cos(angles), radii * np.sin(angles)))


# Unit polygons in image orientation (y grows downwards); None = circle.
_POLYGONS: dict[str, tuple[tuple[float, float], ...] | None] = {
    "circle": None,
    "square": _unit([(-1, -1), (1, -1), (1, 1), (-1, 1)]),
    "triangle": _unit([(0, -1), (1, 1), (-1, 1)]),
    "diamond": _unit([(0, -1), (1, 0), (0, 1), (-1, 0)]),
    "star": _unit(_star()),
}
# Half width and half height of each shape's box, in units of r.
_HALF_EXTENT = {
    s: (1.0, 1.0) if p is None else (max(x for x, _ in p), max(y for _, y in p))
    for s, p in _POLYGONS.items()
}


# ---------------------------------------------------------------------------------------------
# Scenes


@dataclass(frozen=True)
class Obj:
    """One shape; centre (x, y) and circumradius r are fractions of the image side."""

    shape: str
    color: str
    size: str
    x: float
    y: float
    r: float


@dataclass(frozen=True)
class Scene:
    """A sampled layout; objects are sorted left to right (by x, then y), as captions use."""

    key: str
    split: str
    index: int
    seed: int
    objects: tuple[Obj, ...]

    @property
    def entropy(self) -> list[int]:
        """The words seeding this scene's random streams."""
        return [self.seed, SPLITS[self.split], self.index]


def relation(a: Obj, b: Obj) -> str:
    """Where ``a`` is relative to ``b``, along the axis of their larger centre offset."""
    dx, dy = b.x - a.x, b.y - a.y
    if abs(dx) >= abs(dy):
        return "left_of" if dx > 0 else "right_of"
    return "above" if dy > 0 else "below"  # image y grows downwards


def relations(scene: Scene) -> list[tuple[int, str, int]]:
    """The (subject, relation, object) triples a caption states: consecutive objects."""
    objs = scene.objects
    return [(i, relation(objs[i], objs[i + 1]), i + 1) for i in range(len(objs) - 1)]


def location(obj: Obj) -> str:
    """The 3x3 grid cell holding the object's centre."""
    col, row = min(int(obj.x * 3), 2), min(int(obj.y * 3), 2)
    return LOCATIONS[3 * row + col]


def object_box(obj: Obj) -> list[float]:
    """Normalised [x1, y1, x2, y2] tightly around the drawn shape."""
    hx, hy = _HALF_EXTENT[obj.shape]
    box = (obj.x - hx * obj.r, obj.y - hy * obj.r, obj.x + hx * obj.r, obj.y + hy * obj.r)
    return [round(min(max(v, 0.0), 1.0), 4) for v in box]


def _layout_ok(xy: np.ndarray, r: np.ndarray) -> bool:
    pairs = ~np.eye(len(r), dtype=bool)
    dist = np.linalg.norm(xy[:, None] - xy[None], axis=-1)
    if (dist[pairs] < (r[:, None] + r[None] + GAP)[pairs]).any():
        return False
    if len(r) == 1:  # a lone object is described by grid cell: keep it clear of the cell borders
        off = np.abs(xy[0][:, None] - np.array([1 / 3, 2 / 3]))
        return bool(off.min() >= GRID_MARGIN)
    d = np.abs(np.diff(xy[np.argsort(xy[:, 0], kind="stable")], axis=0))
    big, small = d.max(1), d.min(1)
    return bool((big >= DOMINANCE * small).all())


def sample_scene(seed: int, split: str, index: int) -> Scene:
    """Sample the layout of scene ``index`` of ``split``; depends on nothing else."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choices: {', '.join(SPLITS)}")
    rng = np.random.default_rng([seed, SPLITS[split], index])
    n = int(rng.choice(len(N_OBJECTS_P), p=N_OBJECTS_P)) + 1
    colors, sizes = list(COLORS), list(SIZES)
    # distinct (shape, colour) pairs: "the red circle" always names one object
    combos = rng.choice(len(SHAPES) * len(colors), size=n, replace=False)
    size_ids = rng.integers(0, len(sizes), size=n)
    r = np.array([SIZES[sizes[s]] for s in size_ids])
    lo = (EDGE + r)[:, None]
    for _ in range(_MAX_TRIES):
        xy = rng.uniform(lo, 1 - lo, size=(n, 2))
        if _layout_ok(xy, r):
            break
    else:  # pragma: no cover - the constraints leave plenty of room
        raise RuntimeError(f"could not place scene {split}/{index} (seed {seed})")
    objs = [
        Obj(
            shape=SHAPES[int(c) // len(colors)],
            color=colors[int(c) % len(colors)],
            size=sizes[int(s)],
            x=float(x),
            y=float(y),
            r=float(rad),
        )
        for c, s, (x, y), rad in zip(combos, size_ids, xy, r)
    ]
    objs.sort(key=lambda o: (o.x, o.y))
    return Scene(f"{split}{index:06d}", split, index, seed, tuple(objs))


# ---------------------------------------------------------------------------------------------
# Pixels


def render(scene: Scene, image_size: int) -> Image.Image:
    """Draw the scene as an RGB image of ``image_size`` x ``image_size`` pixels."""
    big = image_size * SUPERSAMPLE
    img = Image.new("RGB", (big, big), BACKGROUND)
    draw = ImageDraw.Draw(img)
    for o in scene.objects:
        cx, cy, r = o.x * big, o.y * big, o.r * big
        fill = COLORS[o.color]
        poly = _POLYGONS[o.shape]
        if poly is None:
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        else:
            draw.polygon([(cx + r * u, cy + r * v) for u, v in poly], fill=fill)
    img = img.resize((image_size, image_size), Image.Resampling.BOX)
    rng = np.random.default_rng([*scene.entropy, _RENDER_STREAM])
    noise = rng.integers(-NOISE, NOISE + 1, size=(image_size, image_size, 1))
    pixels = np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def encode_jpeg(img: Image.Image) -> bytes:
    """JPEG bytes at a fixed quality; 4:4:4 keeps small shapes' colours clean."""
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=JPEG_QUALITY, subsampling=0)
    return buf.getvalue()


@lru_cache(maxsize=1)
def _jpegs(scenes: tuple[Scene, ...], image_size: int) -> tuple[bytes, ...]:
    """The scenes' JPEGs; cached because the image_text, regions and vqa views all need them."""
    return tuple(encode_jpeg(render(s, image_size)) for s in scenes)
