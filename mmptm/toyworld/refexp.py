"""toyworld's referring expressions (RefCOCO's analogue): phrases naming one object of a scene.

For every object of a scene that no other object shares its size, colour and shape with, a
sample whose ``txt`` is its noun phrase in one language ("a large red circle", as
:func:`~mmptm.toyworld.language.object_phrase` words it), whose ``regions.npz`` is the scene's
detections (the regions view's bytes: one region per object) and whose ``json`` holds the
gold box ``ref_box`` (the object's normalised box, what ``mmptm data refcoco`` writes from a
RefCOCO annotation), ``ref_id`` (``<scene key>_<object index>``), ``image_id`` and
``object``. Shards: ``{out}/{split}-%06d.tar`` for train, val and test; the scenes are
toyworld's (``sample_scene(seed, split, i)``): the images a toyworld pre-training run saw.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from mmptm.data.shards import ShardWriter
from mmptm.registry import CONVERTERS
from mmptm.toyworld.detector import _detections
from mmptm.toyworld.language import LANGUAGES, object_phrase
from mmptm.toyworld.scene import Scene, object_box, sample_scene


def expressions(scene: Scene, lang: str = "en") -> list[tuple[int, str]]:
    """(object index, phrase) of each object whose phrase names it alone in the scene."""
    phrases = [object_phrase(o.shape, o.color, o.size, lang) for o in scene.objects]
    counts = Counter(phrases)
    return [(i, p) for i, p in enumerate(phrases) if counts[p] == 1]


def write_refexp(
    out: str | Path,
    *,
    n_train: int = 4000,
    n_val: int = 500,
    n_test: int = 500,
    seed: int = 0,
    lang: str = "en",
    image_size: int = 64,
    shard_size: int = 1000,
) -> dict[str, Any]:
    """Write the referring-expression shards under ``out`` (module docstring)."""
    if lang not in LANGUAGES:
        raise ValueError(f"unknown toyworld language {lang!r}; choices: {', '.join(LANGUAGES)}")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    stats: dict[str, Any] = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        scenes = tuple(sample_scene(seed, split, i) for i in range(n))
        media = _detections(scenes, image_size)
        written = 0
        with ShardWriter(root / f"{split}-%06d.tar", shard_size) as writer:
            for scene, (jpg, npz) in zip(scenes, media):
                for i, phrase in expressions(scene, lang):
                    meta = {"ref_id": f"{scene.key}_{i}", "image_id": scene.key, "object": i,
                            "ref_box": object_box(scene.objects[i]), "split": split}  # fmt: skip
                    key = f"{scene.key}_{i}"
                    writer.write({"__key__": key, "jpg": jpg, "regions.npz": npz, "txt": phrase,
                                  "json": meta})  # fmt: skip
                    written += 1
        stats[split] = {"scenes": n, "expressions": written}
    return stats


CONVERTERS.register_writer(
    "toyworld-refexp", "toyworld's referring expressions (a phrase naming one object)",
    write_refexp, ("n_train", "n_val", "n_test", "seed", "lang", "image_size", "shard_size"),
    "data/toyworld/refexp", {"lang": f"one of {', '.join(LANGUAGES)}"},
)  # fmt: skip


__all__ = ["expressions", "write_refexp"]
