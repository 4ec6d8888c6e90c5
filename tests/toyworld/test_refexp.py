"""toyworld's referring expressions: one phrase per object no other object of its scene shares,
its gold box the object's region."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmptm.cli import main
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.modalities.regions_io import load_regions
from mmptm.toyworld.refexp import expressions, write_refexp
from mmptm.toyworld.scene import sample_scene


def test_expressions_name_one_object_each():
    n_objects = n_named = 0
    for i in range(200):
        scene = sample_scene(0, "train", i)
        attrs = [(o.size, o.color, o.shape) for o in scene.objects]
        named = dict(expressions(scene))
        for j, a in enumerate(attrs):  # brute force: unique attributes ⇔ named
            assert (j in named) == (attrs.count(a) == 1)
            if j in named:
                assert named[j].split()[1:] == list(a)  # "a large red circle"
        n_objects += len(attrs)
        n_named += len(named)
    assert n_named > 0.8 * n_objects
    assert expressions(sample_scene(0, "train", 0), "de")[0][1].split()[0] in {"ein", "eine"}


def test_shards_hold_the_gold_box_of_the_named_region(tmp_path):
    assert main(["data", "toyworld-refexp", "--out", str(tmp_path), "--n-train", "6",
                 "--n-val", "2", "--n-test", "2", "--image-size", "32"]) == 0  # fmt: skip
    samples = list(tar_samples(expand_shards(f"{tmp_path}/train-*.tar"), SkipCounter()))
    scenes = {sample_scene(0, "train", i).key: sample_scene(0, "train", i) for i in range(6)}
    assert len(samples) == sum(len(expressions(s)) for s in scenes.values())
    for s in samples:
        meta = json.loads(s["json"])
        boxes = load_regions(s["regions.npz"])["boxes"]
        assert len(boxes) == len(scenes[meta["image_id"]].objects)
        np.testing.assert_allclose(boxes[meta["object"]], meta["ref_box"], atol=1e-6)
        o = scenes[meta["image_id"]].objects[meta["object"]]
        assert s["txt"].decode() == f"a {o.size} {o.color} {o.shape}"
    with pytest.raises(ValueError, match="unknown toyworld language"):
        write_refexp(tmp_path, n_train=1, n_val=1, n_test=1, lang="xx")
