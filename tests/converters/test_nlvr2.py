"""NLVR2 json lines + region TSV → pair samples; malformed lines named by line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmptm.cli import main
from mmptm.converters.nlvr2 import convert_nlvr2, pair_images
from mmptm.converters.vl import write_butd_tsv
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.modalities.regions_io import load_regions


def _region(image_id: str, n: int) -> dict:
    return {"image_id": image_id, "image_size": [100, 50],
            "boxes": np.tile(np.float32([[0.1, 0.2, 0.3, 0.4]]), (n, 1)),
            "features": np.full((n, 3), n, np.float32)}  # fmt: skip


def test_pairs_and_skips(tmp_path):
    write_butd_tsv(tmp_path / "r.tsv", [_region("dev-1-0-img0", 2), _region("dev-1-0-img1", 3)],
                   layout="lxmert")  # fmt: skip
    lines = [
        {"identifier": "dev-1-0-0", "sentence": "Two dogs. ", "label": "True"},
        {"identifier": "dev-1-0-1", "sentence": "No dogs.", "label": "False"},
        "not json",
        {"identifier": "dev-1-0-2", "sentence": "x"},  # no label
        {"identifier": "dev-1-0-3", "sentence": "x", "label": "maybe"},
        {"identifier": "dev-2-0-0", "sentence": "x", "label": "True"},  # no regions
    ]
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    (tmp_path / "dev.json").write_text(text)
    r = convert_nlvr2(tmp_path / "dev.json", tmp_path / "r.tsv", tmp_path / "out", split="val")
    assert r["written"] == 2
    assert r["skipped"] == {"bad_json": 1, "bad_entry": 1, "bad_label": 1, "missing_regions": 1}
    assert r["skipped_lines"] == {"bad_json": [3], "bad_entry": [4], "bad_label": [5],
                                  "missing_regions": [6]}  # fmt: skip
    samples = list(tar_samples(expand_shards(f"{tmp_path}/out/val-*.tar"), SkipCounter()))
    first = json.loads(samples[0]["json"])
    assert first == {"identifier": "dev-1-0-0", "sentence": "Two dogs.", "label": "True",
                     "left": "dev-1-0-img0", "right": "dev-1-0-img1"}  # fmt: skip
    assert samples[0]["txt"].decode() == "Two dogs."
    assert len(load_regions(samples[0]["regions.npz"])["boxes"]) == 2
    assert len(load_regions(samples[0]["right.regions.npz"])["boxes"]) == 3
    assert json.loads(samples[1]["json"])["label"] == "False"
    assert pair_images({"identifier": "a", "left_image": "L", "right_image": "R"}) == ("L", "R")


def test_the_command(tmp_path):
    write_butd_tsv(tmp_path / "r.tsv", [_region("t-1-0-img0", 1), _region("t-1-0-img1", 1)],
                   layout="butd")  # fmt: skip
    line = {"identifier": "t-1-0-0", "sentence": "A cat.", "label": True}
    (tmp_path / "t.json").write_text(json.dumps(line) + "\n")
    args = ["--regions", str(tmp_path / "r.tsv"), "--out", str(tmp_path / "o"), "--split", "train"]
    assert main(["data", "nlvr2", "--input", str(tmp_path / "t.json"), *args]) == 0
    assert (tmp_path / "o" / "train-000000.tar").is_file()
    with pytest.raises(FileNotFoundError, match="no such file"):
        convert_nlvr2(tmp_path / "none.json", tmp_path / "r.tsv", tmp_path / "o", split="train")
