"""RefCOCO's refs pickle + instances.json + region TSV → shards; malformed entries named."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from mmptm.cli import main
from mmptm.converters.refexp import convert_refcoco, normalised_box, read_refs
from mmptm.converters.vl import write_butd_tsv
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.modalities.regions_io import load_regions


def _ref(ref_id, ann_id, image_id, split, *sents):
    sentences = [{"sent_id": 10 * ref_id + j, "sent": s, "raw": s, "tokens": s.split()}
                 for j, s in enumerate(sents)]  # fmt: skip
    return {"ref_id": ref_id, "ann_id": ann_id, "image_id": image_id, "split": split,
            "category_id": 1, "sentences": sentences, "file_name": "x.jpg"}  # fmt: skip


@pytest.fixture
def refcoco(tmp_path):
    refs = [
        _ref(1, 100, 7, "train", "man on the left", "left guy"),
        _ref(2, 101, 7, "testA", "woman in red"),
        _ref(3, 102, 8, "train", "dog"),  # image 8 has no region features
        _ref(4, 999, 7, "train", "no such annotation"),
        {"ref_id": 5},  # malformed
        _ref(6, 100, 7, "val", "   "),  # an empty sentence
    ]
    (tmp_path / "refs(unc).p").write_bytes(pickle.dumps(refs, protocol=2))
    instances = {
        "images": [{"id": 7, "width": 200, "height": 100}, {"id": 8, "width": 50, "height": 50}],
        "annotations": [{"id": 100, "bbox": [20, 10, 60, 40], "image_id": 7},
                        {"id": 101, "bbox": [100, 0, 100, 100], "image_id": 7},
                        {"id": 102, "bbox": [0, 0, 10, 10], "image_id": 8}, {"id": 103}],
    }  # fmt: skip
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    boxes = np.array([[0.1, 0.1, 0.4, 0.5], [0.5, 0.0, 1.0, 1.0]], np.float32)
    rec = {"image_id": 7, "image_size": [200, 100], "boxes": boxes,
           "features": np.ones((2, 4), np.float32)}  # fmt: skip
    write_butd_tsv(tmp_path / "regions.tsv", [rec], layout="butd")
    return tmp_path


def test_one_sample_per_sentence_with_the_normalised_gold_box(refcoco, tmp_path):
    out = tmp_path / "shards"
    r = convert_refcoco(refcoco / "refs(unc).p", refcoco / "instances.json",
                        refcoco / "regions.tsv", out)  # fmt: skip
    assert r["splits"]["train"] == 2 and r["splits"]["testA"] == 1 and r["written"] == 3
    assert r["skipped"] == {"bad_annotation": 1, "missing_regions": 1, "missing_annotation": 1,
                            "bad_ref": 1, "bad_sentence": 1}  # fmt: skip
    assert r["skipped_items"]["bad_ref"] == ["refs[4] (needs ref_id, ann_id, image_id, split, "
                                             "sentences)"]  # fmt: skip
    assert "refs[2]" in r["skipped_items"]["missing_regions"][0]
    train = list(tar_samples(expand_shards(f"{out}/train-*.tar"), SkipCounter()))
    assert [s["__key__"] for s in train] == ["1_10", "1_11"]
    assert train[1]["txt"].decode() == "left guy"
    meta = json.loads(train[0]["json"])
    # by hand: [20, 10, 60, 40] in a 200 x 100 image → x 0.1..0.4, y 0.1..0.5
    assert meta["ref_box"] == pytest.approx([0.1, 0.1, 0.4, 0.5])
    assert (meta["ref_id"], meta["ann_id"], meta["image_id"], meta["sent_id"]) == (1, 100, 7, 10)
    np.testing.assert_allclose(load_regions(train[0]["regions.npz"])["boxes"][0], meta["ref_box"],
                               atol=1e-6)  # fmt: skip
    test_a = list(tar_samples(expand_shards(f"{out}/testA-*.tar"), SkipCounter()))
    assert json.loads(test_a[0]["json"])["ref_box"] == pytest.approx([0.5, 0.0, 1.0, 1.0])


def test_the_command_and_its_errors(refcoco, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["data", "refcoco", "--refs", str(refcoco / "refs(unc).p"), "--instances",
                 str(refcoco / "instances.json"), "--regions", str(refcoco / "regions.tsv"),
                 "--out", str(out), "--splits", "testA", "--no-progress"]) == 0  # fmt: skip
    assert [p.name for p in sorted(out.glob("*.tar"))] == ["testA-000000.tar"]
    with pytest.raises(ValueError, match="unknown split"):
        convert_refcoco(refcoco / "refs(unc).p", refcoco / "instances.json",
                        refcoco / "regions.tsv", out, splits=["dev"])  # fmt: skip
    evil = tmp_path / "evil.p"
    evil.write_bytes(pickle.dumps(np.zeros(2)))  # a class: refused, never built
    with pytest.raises(ValueError, match="evil.p: not a refs pickle"):
        read_refs(evil)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_refs(tmp_path / "none.p")
    assert normalised_box([0, 0, -1, 2], 10, 10) is None
    assert normalised_box([0, 0, 5, 5], 0, 10) is None
