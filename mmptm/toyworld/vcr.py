"""toyworld's VCR analogue: a question about a scene, four answers, and four rationales.

Question i of a split is about scene i of toyworld's ``sample_scene(seed, split, ·)``, asked
of an object whose shape no other object of the scene has, beside at least one other object
(a scene without one asks nothing, so a split may have fewer questions than scenes):

- Q→A: "What color is the circle?"; the answers "It is red." (right) and three others whose
  colours are, as far as the scene has them, those of its other objects (then drawn from the
  rest of the palette): the words alone cannot tell the right one;
- QA→R: "What color is the circle? It is red."; the rationales "The red circle is to the left
  of the blue square." (right: the object's place relative to another object of the scene,
  along the axis where that object lies clearly apart when one does) and the same sentence
  with each of the three other relations: only the image tells them apart.

Choices come in a random order. Samples (``{split}-%06d.tar``, as ``mmptm data vcr`` writes
them: :func:`~mmptm.converters.vcr.vcr_samples`): two per question, keyed ``<question
id>-qa`` and ``<question id>-qar``, each with the scene's ``regions.npz`` (one region per
object) and ``json`` = ``{"question_id", "task", "question", "choices", "label",
"image_id", "object"}``; the question id is the scene's key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mmptm.converters.vcr import vcr_samples
from mmptm.data.shards import ShardWriter
from mmptm.registry import CONVERTERS
from mmptm.toyworld.detector import _detections
from mmptm.toyworld.language import LEXICON
from mmptm.toyworld.scene import (
    COLORS,
    DOMINANCE,
    RELATIONS,
    SPLITS,
    Obj,
    Scene,
    relation,
    sample_scene,
)

_STREAM = 17  # entropy word of the questions, apart from the scenes' own
_CHOICES = 4


def _clear(a: Obj, b: Obj) -> bool:
    """Whether ``a`` lies apart from ``b`` along one axis (the stated relation is plain)."""
    dx, dy = abs(b.x - a.x), abs(b.y - a.y)
    return max(dx, dy) >= DOMINANCE * min(dx, dy)


def _shuffled(right: str, others: list[str], rng: np.random.Generator) -> tuple[list[str], int]:
    """The right choice and the others in a random order, and where the right one went."""
    choices = [right, *others]
    order = rng.permutation(len(choices))
    return [choices[k] for k in order], int(np.argmax(order == 0))


def vcr_question(scene: Scene, rng: np.random.Generator) -> dict[str, Any] | None:
    """One question about the scene with its answers and rationales (module docstring), or
    None when the scene cannot pose one."""
    objs = scene.objects
    shapes = [o.shape for o in objs]
    targets = [i for i, o in enumerate(objs) if shapes.count(o.shape) == 1]
    if len(objs) < 2 or not targets:
        return None
    t = targets[int(rng.integers(len(targets)))]
    target = objs[t]
    partners = [j for j in range(len(objs)) if j != t]
    clear = [j for j in partners if _clear(target, objs[j])]
    partner = objs[(clear or partners)[int(rng.integers(len(clear or partners)))]]
    seen = list(dict.fromkeys(o.color for o in objs if o.color != target.color))
    rest = [c for c in COLORS if c != target.color and c not in seen]
    wrong = [seen[k] for k in rng.permutation(len(seen))]
    wrong += [rest[k] for k in rng.permutation(len(rest))]
    answers, a_label = _shuffled(
        f"It is {target.color}.", [f"It is {c}." for c in wrong[: _CHOICES - 1]], rng
    )
    words = LEXICON["en"]["relations"]
    said = {r: f"The {target.color} {target.shape} is {words[r][0]} the {partner.color} "
                f"{partner.shape}." for r in RELATIONS}  # fmt: skip
    true = relation(target, partner)
    rationales, r_label = _shuffled(said[true], [said[r] for r in RELATIONS if r != true], rng)
    question = f"What color is the {target.shape}?"
    return {"question": question, "answers": answers, "answer_label": a_label,
            "rationales": rationales, "rationale_label": r_label, "object": t}  # fmt: skip


def write_vcr(
    out: str | Path,
    *,
    n_train: int = 2000,
    n_val: int = 250,
    n_test: int = 250,
    seed: int = 0,
    image_size: int = 64,
    shard_size: int = 1000,
) -> dict[str, Any]:
    """Write the questions of ``n_*`` scenes per split under ``out`` (module docstring)."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    stats: dict[str, Any] = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        scenes = tuple(sample_scene(seed, split, i) for i in range(n))
        media = _detections(scenes, image_size)
        asked = 0
        with ShardWriter(root / f"{split}-%06d.tar", shard_size) as writer:
            for i, scene in enumerate(scenes):
                q = vcr_question(scene, np.random.default_rng([seed, _STREAM, SPLITS[split], i]))
                if q is None:
                    continue
                q["image_id"] = scene.key
                for sample in vcr_samples(scene.key, q, {"regions.npz": media[i][1]}):
                    writer.write(sample)
                asked += 1
        stats[split] = {"scenes": n, "questions": asked, "samples": 2 * asked}
    return stats


CONVERTERS.register_writer(
    "toyworld-vcr", "toyworld's VCR analogue (answers and rationales about a scene)", write_vcr,
    ("n_train", "n_val", "n_test", "seed", "image_size", "shard_size"), "data/toyworld/vcr",
)  # fmt: skip


__all__ = ["vcr_question", "write_vcr"]
