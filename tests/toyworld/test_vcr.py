"""toyworld's VCR analogue: every right answer and rationale re-derived from the scene."""

from __future__ import annotations

import json
import re
from collections import Counter

from mmptm.cli import main
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.modalities.regions_io import load_regions
from mmptm.toyworld.scene import sample_scene

_PHRASES = {"to the left of": "left", "to the right of": "right", "above": "above",
            "below": "below"}  # fmt: skip
_RATIONALE = re.compile(r"The (\w+) (\w+) is (to the left of|to the right of|above|below) the "
                        r"(\w+) (\w+)\.")  # fmt: skip


def _side(a, b) -> str:
    """Where ``a`` is from ``b``, along the axis they are further apart on (y grows down)."""
    dx, dy = a.x - b.x, a.y - b.y
    if abs(dx) >= abs(dy):
        return "left" if dx < 0 else "right"
    return "above" if dy < 0 else "below"


def test_answers_and_rationales_are_labelled_by_the_scene(tmp_path):
    assert main(["data", "toyworld-vcr", "--out", str(tmp_path), "--n-train", "60",
                 "--n-val", "2", "--n-test", "2", "--image-size", "32"]) == 0  # fmt: skip
    samples = list(tar_samples(expand_shards(f"{tmp_path}/train-*.tar"), SkipCounter()))
    assert 40 <= len(samples) <= 120 and len(samples) % 2 == 0
    labels = Counter()
    for qa, qar in zip(samples[0::2], samples[1::2]):
        a, r = json.loads(qa["json"]), json.loads(qar["json"])
        scene = sample_scene(0, "train", int(re.search(r"\d+$", a["question_id"])[0]))
        assert a["question_id"] == r["question_id"] == scene.key
        assert (qa["__key__"], qar["__key__"]) == (f"{scene.key}-qa", f"{scene.key}-qar")
        assert (a["task"], r["task"]) == ("qa", "qar")
        shape = re.fullmatch(r"What color is the (\w+)\?", a["question"])[1]
        (target,) = [o for o in scene.objects if o.shape == shape]  # the one of its shape
        assert a["choices"][a["label"]] == f"It is {target.color}."
        colours = [re.fullmatch(r"It is (\w+)\.", c)[1] for c in a["choices"]]
        assert len(set(colours)) == 4
        others = {o.color for o in scene.objects} - {target.color}
        assert set(colours) >= others or len(others) > 3  # the scene's colours come first
        assert r["question"] == f"{a['question']} It is {target.color}."
        parsed = [_RATIONALE.fullmatch(c) for c in r["choices"]]
        assert all(p and (p[1], p[2]) == (target.color, target.shape) for p in parsed)
        assert len({_PHRASES[p[3]] for p in parsed}) == 4  # the four relations
        assert len({(p[4], p[5]) for p in parsed}) == 1  # to one partner
        right = parsed[r["label"]]
        partners = [o for o in scene.objects if (o.color, o.shape) == (right[4], right[5])]
        assert _PHRASES[right[3]] in {_side(target, o) for o in partners if o is not target}
        assert len(load_regions(qa["regions.npz"])["boxes"]) == len(scene.objects)
        assert qa["regions.npz"] == qar["regions.npz"]
        labels.update([a["label"], r["label"]])
    assert len(labels) == 4 and min(labels.values()) >= 0.1 * sum(labels.values())
