"""VCR json lines + detections + region TSV → Q→A and QA→R samples; malformed lines named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmptm.cli import main
from mmptm.converters.vcr import convert_vcr, render_tokens
from mmptm.converters.vl import write_butd_tsv
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.modalities.regions_io import load_regions

OBJECTS = ["person", "person", "car"]


def _line(annot_id: str, img_id: str, **changes) -> dict:
    line = {
        "annot_id": annot_id, "img_id": img_id, "objects": OBJECTS,
        "img_fn": f"movie/{img_id}.jpg", "metadata_fn": f"movie/{img_id}.json",
        "question": ["Why", "is", [0], "looking", "at", [1, 2], "?"],
        "answer_choices": [[[0], "is", "lost", "."], ["It", "'s", "late", "."],
                           [[2], "is", "red", "."], ["No", "."]],
        "rationale_choices": [["A"], ["B"], ["C", ",", "D"], [[0, 1, 2], "."]],
        "answer_label": 2, "rationale_label": 3,
    }  # fmt: skip
    line.update(changes)
    return line


def _world(tmp_path, img_ids=("val-0", "val-1"), regions=3):
    (tmp_path / "images" / "movie").mkdir(parents=True)
    boxes = [[10, 20, 30, 40, 0.9], [0, 0, 200, 100, 0.8], [50, 50, 100, 100, 0.7]]
    for img in img_ids:
        meta = {"boxes": boxes, "names": OBJECTS, "width": 200, "height": 100}
        (tmp_path / "images" / "movie" / f"{img}.json").write_text(json.dumps(meta))
    records = [{"image_id": img, "image_size": [200, 100],
                "boxes": np.zeros((regions, 4), np.float32),
                "features": np.full((regions, 3), k, np.float32)}
               for k, img in enumerate(img_ids)]  # fmt: skip
    write_butd_tsv(tmp_path / "r.tsv", records, layout="lxmert")


def test_references_render_as_class_names():
    assert render_tokens(["Why", "is", [0], "at", [1, 2], "?"], OBJECTS) == (
        "Why is person at person and car?"
    )
    assert render_tokens([[0, 1, 2], "did", "n't", "go", ",", "it", "'s", "late"], OBJECTS) == (
        "person, person and car didn't go, it's late"
    )


def test_samples_and_skips(tmp_path):
    _world(tmp_path, img_ids=("val-0", "val-1", "val-9"))
    lines = [
        _line("val-0", "val-0"),
        _line("val-1", "val-1", answer_label=0),
        "not json",
        {k: v for k, v in _line("val-2", "val-0").items() if k != "rationale_label"},
        _line("val-3", "val-0", question=["Is", [3], "?"]),  # no detection 3
        _line("val-4", "val-0", answer_choices=[["a"]] * 3),
        _line("val-5", "val-0", answer_label=4),
        _line("val-6", "val-5"),  # no metadata, no features
        _line("val-7", "val-0", question=["Is", 7, "?"]),
    ]
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    (tmp_path / "val.jsonl").write_text(text)
    r = convert_vcr(tmp_path / "val.jsonl", tmp_path / "images", tmp_path / "r.tsv",
                    tmp_path / "out", split="val")  # fmt: skip
    assert r["written"] == 4  # two samples a question
    assert r["skipped_lines"] == {"bad_json": [3], "bad_entry": [4], "bad_reference": [5],
                                  "bad_choices": [6], "bad_label": [7],
                                  "missing_metadata": [8], "bad_tokens": [9]}  # fmt: skip
    samples = list(tar_samples(expand_shards(f"{tmp_path}/out/val-*.tar"), SkipCounter()))
    assert [s["__key__"] for s in samples] == ["val-0-qa", "val-0-qar", "val-1-qa", "val-1-qar"]
    qa, qar = (json.loads(s["json"]) for s in samples[:2])
    assert qa["question"] == "Why is person looking at person and car?"
    assert qa["choices"] == ["person is lost.", "It's late.", "car is red.", "No."]
    assert qa["label"] == 2 and qa["task"] == "qa" and qa["question_id"] == "val-0"
    assert qar["question"] == "Why is person looking at person and car? car is red."
    assert qar["choices"] == ["A", "B", "C, D", "person, person and car."]
    assert qar["label"] == 3 and qar["task"] == "qar" and qar["objects"] == OBJECTS
    regions = load_regions(samples[0]["regions.npz"])
    # the detections' boxes, normalised by the image's size; the TSV's features
    np.testing.assert_allclose(regions["boxes"][0], [0.05, 0.2, 0.15, 0.4])
    np.testing.assert_allclose(regions["boxes"][1], [0.0, 0.0, 1.0, 1.0])
    assert regions["features"].shape == (3, 3) and (regions["features"] == 0).all()
    assert (load_regions(samples[2]["regions.npz"])["features"] == 1).all()
    assert json.loads(samples[3]["json"])["question"].endswith("? person is lost.")


def test_features_not_at_the_detections_and_the_command(tmp_path):
    _world(tmp_path, img_ids=("t-0",), regions=2)  # 2 rows for 3 detections
    (tmp_path / "t.jsonl").write_text(json.dumps(_line("t-0", "t-0")) + "\n")
    r = convert_vcr(tmp_path / "t.jsonl", tmp_path / "images", tmp_path / "r.tsv",
                    tmp_path / "o", split="train")  # fmt: skip
    assert r["written"] == 0 and r["skipped_lines"] == {"regions_mismatch": [1]}
    args = ["--images", str(tmp_path / "images"), "--regions", str(tmp_path / "r.tsv"),
            "--out", str(tmp_path / "o2"), "--split", "train"]  # fmt: skip
    assert main(["data", "vcr", "--input", str(tmp_path / "t.jsonl"), *args]) == 0
    with pytest.raises(FileNotFoundError, match="no such file"):
        convert_vcr(tmp_path / "none.jsonl", tmp_path / "images", tmp_path / "r.tsv",
                    tmp_path / "o", split="train")  # fmt: skip
