"""toyworld's NLVR2 analogue: each statement's label re-derived from the two scenes."""

from __future__ import annotations

import json
import re

import numpy as np

from mmptm.cli import main
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.modalities.regions_io import load_regions
from mmptm.toyworld.scene import sample_scene


def _truth(text: str, left, right) -> bool:
    """The statement's truth, read from its words and the scenes' objects."""
    if m := re.fullmatch(r"The left image has (more|fewer) objects than the right image\.", text):
        a, b = len(left.objects), len(right.objects)
        return a > b if m[1] == "more" else a < b
    m = re.fullmatch(r"(Both images|Exactly one image) contains? a (\w+) (\w+)\.", text)
    assert m, text
    n = sum(any(o.color == m[2] and o.shape == m[3] for o in s.objects) for s in (left, right))
    return n == 2 if m[1] == "Both images" else n == 1


def test_statements_are_labelled_by_the_two_scenes(tmp_path):
    assert main(["data", "toyworld-nlvr2", "--out", str(tmp_path), "--n-train", "60",
                 "--n-val", "2", "--n-test", "2", "--image-size", "32"]) == 0  # fmt: skip
    samples = list(tar_samples(expand_shards(f"{tmp_path}/train-*.tar"), SkipCounter()))
    assert len(samples) == 60
    labels = []
    for i, s in enumerate(samples):
        meta = json.loads(s["json"])
        left, right = sample_scene(0, "train", 2 * i), sample_scene(0, "train", 2 * i + 1)
        assert (meta["left"], meta["right"]) == (left.key, right.key)
        assert meta["label"] == str(_truth(s["txt"].decode(), left, right))
        assert meta["sentence"] == s["txt"].decode()
        assert len(load_regions(s["regions.npz"])["boxes"]) == len(left.objects)
        np.testing.assert_equal(len(load_regions(s["right.regions.npz"])["boxes"]),
                                len(right.objects))  # fmt: skip
        labels.append(meta["label"] == "True")
    assert 0.25 < np.mean(labels) < 0.75  # neither label rare
