"""toyworld's NLVR2 analogue: a statement, true or false, about a pair of scenes.

Pair i of a split shows scenes 2i (left) and 2i+1 (right) of toyworld's ``sample_scene(seed,
split, ·)``. Its statement is one of three kinds, drawn with the pair's own generator:

- "Both images contain a red circle." (true iff each scene has an object of that colour and
  shape),
- "Exactly one image contains a red circle." (true iff one scene has one, the other none),
- "The left image has more objects than the right image." (or "fewer"),

the truth drawn first with a fair coin, then the kind (one that cannot say it of the pair
gives way to the next), so that the words alone say less about the label (a classifier
of the sentence alone still gets 65% right on the test pairs of 1500 training pairs: "both
images" is more often false, "exactly one image" more often true). Samples
(``{split}-%06d.tar``, key ``<split>-<i>``): ``regions.npz`` (left), ``right.regions.npz``
(right), ``txt`` (the statement) and ``json`` as NLVR2's lines have them: ``identifier``,
``sentence``, ``label`` ("True" / "False"), ``left``, ``right`` (the scene keys).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mmptm.data.shards import ShardWriter
from mmptm.registry import CONVERTERS
from mmptm.toyworld.detector import _detections
from mmptm.toyworld.scene import COLORS, SHAPES, SPLITS, Scene, sample_scene

_STREAM = 11  # entropy word of the statements, apart from the scenes' own


def _has(scene: Scene, color: str, shape: str) -> bool:
    return any(o.color == color and o.shape == shape for o in scene.objects)


def _statements(left: Scene, right: Scene, kind: int, extra: tuple[str, str]) -> list:
    """Every (statement, truth) of one kind about the pair."""
    if kind == 2:
        a, b = len(left.objects), len(right.objects)
        return [(f"The left image has {w} objects than the right image.", t)
                for w, t in (("more", a > b), ("fewer", a < b))]  # fmt: skip
    head = "Both images contain" if kind == 0 else "Exactly one image contains"
    pool = sorted({(o.color, o.shape) for s in (left, right) for o in s.objects} | {extra})
    out = []
    for color, shape in pool:
        n = _has(left, color, shape) + _has(right, color, shape)
        out.append((f"{head} a {color} {shape}.", n == 2 if kind == 0 else n == 1))
    return out


def statement(left: Scene, right: Scene, rng: np.random.Generator) -> tuple[str, bool]:
    """A statement about the pair and its truth (module docstring).

    The truth is drawn first (a fair coin), then the kind; a kind that cannot say it of this
    pair gives way to the next that can, so that a statement's words say little of its label.
    """
    want, first = bool(rng.integers(2)), int(rng.integers(3))
    extra = (str(rng.choice(list(COLORS))), str(rng.choice(SHAPES)))  # maybe in neither scene
    for kind in (first, (first + 1) % 3, (first + 2) % 3):
        fit = [st for st in _statements(left, right, kind, extra) if st[1] == want]
        if fit:
            return fit[int(rng.integers(len(fit)))]
    options = _statements(left, right, first, extra)
    return options[int(rng.integers(len(options)))]


def write_nlvr2(
    out: str | Path,
    *,
    n_train: int = 2000,
    n_val: int = 250,
    n_test: int = 250,
    seed: int = 0,
    image_size: int = 64,
    shard_size: int = 1000,
) -> dict[str, Any]:
    """Write ``n_*`` statement pairs per split under ``out`` (module docstring)."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    stats: dict[str, Any] = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        scenes = tuple(sample_scene(seed, split, i) for i in range(2 * n))
        media = _detections(scenes, image_size)
        true = 0
        with ShardWriter(root / f"{split}-%06d.tar", shard_size) as writer:
            for i in range(n):
                left, right = scenes[2 * i], scenes[2 * i + 1]
                rng = np.random.default_rng([seed, _STREAM, SPLITS[split], i])
                text, truth = statement(left, right, rng)
                ident = f"{split}-{i}"
                meta = {"identifier": ident, "sentence": text, "label": str(truth),
                        "left": left.key, "right": right.key}  # fmt: skip
                writer.write({"__key__": ident, "regions.npz": media[2 * i][1],
                              "right.regions.npz": media[2 * i + 1][1], "txt": text,
                              "json": meta})  # fmt: skip
                true += truth
        stats[split] = {"pairs": n, "true": true}
    return stats


CONVERTERS.register_writer(
    "toyworld-nlvr2", "toyworld's NLVR2 analogue (a statement about two scenes)", write_nlvr2,
    ("n_train", "n_val", "n_test", "seed", "image_size", "shard_size"), "data/toyworld/nlvr2",
)  # fmt: skip


__all__ = ["statement", "write_nlvr2"]
