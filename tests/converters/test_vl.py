"""Vision-language converters: COCO captions, VQA v2 and BUTD/LXMERT TSVs in real layouts."""

from __future__ import annotations

import base64
import io
import json
import logging
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import read_shard_samples
from PIL import Image

from mmptm.converters import vl as cvl


def _image(path: Path, color: tuple[int, int, int], size: tuple[int, int], fmt: str) -> Path:
    Image.new("RGB", size, color).save(path, format=fmt)
    return path


def _b64(values: np.ndarray) -> str:
    return base64.b64encode(values.tobytes()).decode("ascii")


def _regions(image_id: int, w: int, h: int, r: int, f: int) -> dict:
    """A region record in pixels, as a detector would give it."""
    rng = np.random.default_rng(image_id)
    x1 = rng.uniform(0, w / 2, r).astype(np.float32)
    y1 = rng.uniform(0, h / 2, r).astype(np.float32)
    boxes = np.stack([x1, y1, x1 + w / 3, y1 + h / 3], 1).astype(np.float32)
    return {
        "image_id": image_id,
        "w": w,
        "h": h,
        "boxes": boxes,
        "features": rng.normal(size=(r, f)).astype(np.float32),
        "labels": rng.integers(0, 1600, r).astype(np.int64),
    }


def _lxmert_row(rec: dict, img_id: str) -> str:
    r = len(rec["boxes"])
    conf = np.full(r, 0.9, np.float32)
    cols = [img_id, str(rec["h"]), str(rec["w"]), _b64(rec["labels"]), _b64(conf)]
    cols += [_b64(np.zeros(r, np.int64)), _b64(conf), str(r), _b64(rec["boxes"])]
    return "\t".join([*cols, _b64(rec["features"])])


def _butd_row(rec: dict) -> str:
    cols = [str(rec["image_id"]), str(rec["w"]), str(rec["h"]), str(len(rec["boxes"]))]
    return "\t".join([*cols, _b64(rec["boxes"]), _b64(rec["features"])])


def _normalised(rec: dict) -> np.ndarray:
    return rec["boxes"] / np.float32([rec["w"], rec["h"], rec["w"], rec["h"]])


# ---------------------------------------------------------------------------------------------
# BUTD / LXMERT TSV and regions.npz


def test_read_both_tsv_layouts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a, b = _regions(1, 640, 480, 36, 1024), _regions(2, 500, 375, 10, 8)  # a: a 196 KB field
    lx = tmp_path / "lxmert.tsv"
    bad_b64 = _lxmert_row(b, "COCO_val2014_000000000002").replace("\t10\t", "\t11\t")
    lx.write_text(
        "\n".join([_lxmert_row(a, "COCO_val2014_000000000001"), "x\t1\t2", bad_b64, ""]),
        encoding="utf-8",
    )
    stats: dict = {}
    with caplog.at_level(logging.WARNING):
        got = list(cvl.read_butd_tsv(lx, stats=stats))
    assert stats == {"read": 1, "skipped": {"malformed": 2}, "skipped_lines": {"malformed": [2, 3]}}
    assert f"{lx}:2" in caplog.text and f"{lx}:3" in caplog.text
    (rec,) = got
    assert rec["image_id"] == "COCO_val2014_000000000001"
    np.testing.assert_array_equal(rec["features"], a["features"])
    np.testing.assert_allclose(rec["boxes"], _normalised(a), rtol=1e-6)
    np.testing.assert_array_equal(rec["labels"], a["labels"])
    assert rec["image_size"].tolist() == [640, 480] and rec["probs"] is None

    bu = tmp_path / "butd.tsv"
    bu.write_text(_butd_row(a) + "\n" + _butd_row(b) + "\n", encoding="utf-8")
    got = list(cvl.read_butd_tsv(bu))
    assert [r["image_id"] for r in got] == [1, 2]
    for rec, src in zip(got, (a, b)):
        assert rec["features"].shape == src["features"].shape and rec["labels"] is None
        np.testing.assert_array_equal(rec["features"], src["features"])
        np.testing.assert_allclose(rec["boxes"], _normalised(src), rtol=1e-6)
        assert rec["image_size"].tolist() == [src["w"], src["h"]]
        assert rec["boxes"].dtype == np.float32 and 0 <= rec["boxes"].min() <= 1


def test_write_butd_tsv_round_trips(tmp_path: Path) -> None:
    src = _regions(7, 64, 64, 3, 5)
    record = {**src, "boxes": _normalised(src), "image_size": [64, 64]}
    for layout in ("lxmert", "butd"):
        path = tmp_path / f"{layout}.tsv"
        assert cvl.write_butd_tsv(path, [record], layout=layout) == 1
        (back,) = cvl.read_butd_tsv(path)
        np.testing.assert_array_equal(back["boxes"], record["boxes"])  # x 64 / 64 is exact
        np.testing.assert_array_equal(back["features"], record["features"])
        assert (back["labels"] is None) == (layout == "butd")
    with pytest.raises(ValueError, match="layout"):
        cvl.write_butd_tsv(tmp_path / "x.tsv", [record], layout="csv")


def test_regions_npz_is_deterministic_and_typed() -> None:
    rec = {
        "features": np.ones((2, 3), np.float64),
        "boxes": [[0, 0, 0.5, 0.5], [0.1, 0.2, 1, 1]],
        "image_size": (64, 48),
        "probs": np.full((2, 5), 0.2),
        "labels": [1, 4],
    }
    data = cvl.regions_npz_bytes(rec)
    assert data == cvl.regions_npz_bytes(dict(rec))
    with zipfile.ZipFile(io.BytesIO(data)) as zf:  # no clock in the bytes, unlike np.savez
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    arrays = cvl.load_regions(data)
    assert list(arrays) == ["features", "boxes", "image_size", "probs", "labels"]
    assert arrays["features"].dtype == np.float32 and arrays["labels"].dtype == np.int64
    assert arrays["image_size"].dtype == np.int32 and arrays["image_size"].tolist() == [64, 48]
    with np.load(io.BytesIO(data)) as npz:  # plain numpy reads it
        np.testing.assert_array_equal(npz["probs"], np.full((2, 5), 0.2, np.float32))
    assert list(cvl.load_regions(cvl.regions_npz_bytes({**rec, "probs": None}))) == [
        "features",
        "boxes",
        "image_size",
        "labels",
    ]
    with pytest.raises(ValueError, match="boxes"):
        cvl.regions_npz_bytes({**rec, "boxes": [[0, 0, 1, 1]]})
    with pytest.raises(ValueError, match="labels"):
        cvl.regions_npz_bytes({**rec, "labels": [1, 2, 3]})


# ---------------------------------------------------------------------------------------------
# COCO captions


@pytest.fixture
def coco(tmp_path: Path) -> tuple[Path, Path]:
    images = tmp_path / "val2014"
    images.mkdir()
    _image(images / "COCO_val2014_000000000001.jpg", (200, 10, 10), (40, 30), "JPEG")
    _image(images / "COCO_val2014_000000000002.jpg", (10, 200, 10), (20, 20), "PNG")  # misnamed
    names = {i: f"COCO_val2014_{i:012d}.jpg" for i in (1, 2, 3)}  # 3 is missing
    data = {
        "info": {"description": "COCO 2014"},
        "images": [
            {"id": i, "file_name": names[i], "width": w, "height": h}
            for i, (w, h) in zip((1, 2, 3), [(40, 30), (20, 20), (10, 10)])
        ],
        "annotations": [
            {"image_id": 2, "id": 20, "caption": "A green square."},
            {"image_id": 1, "id": 10, "caption": "A red image.\n"},
            {"image_id": 3, "id": 30, "caption": "Lost."},
            {"image_id": 1, "id": 11, "caption": "Red, all red."},
            {"image_id": 9, "id": 90, "caption": "Nowhere."},
            {"image_id": 2, "id": 21, "caption": "  "},
        ],
    }
    path = tmp_path / "captions_val2014.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path, images


def test_coco_captions(coco: tuple[Path, Path], tmp_path: Path) -> None:
    captions, images = coco
    stats = cvl.convert_coco_captions(captions, images, tmp_path / "out", split="val", shard_size=2)
    assert stats["written"] == 3
    assert stats["skipped"] == {"missing_image": 1, "unknown_image": 1, "empty": 1}
    assert "COCO_val2014_000000000003.jpg" in stats["skipped_items"]["missing_image"][0]
    assert [Path(p).name for p in stats["shards"]] == ["val-000000.tar", "val-000001.tar"]
    samples = read_shard_samples(stats["shards"])
    assert [k for k, _ in samples] == ["10", "11", "20"]  # image order, then caption order
    first = samples[0][1]
    assert set(first) == {"jpg", "txt", "json"}
    assert first["jpg"] == (images / "COCO_val2014_000000000001.jpg").read_bytes()
    assert first["txt"] == b"A red image."
    assert json.loads(first["json"]) == {
        "image_id": 1,
        "caption_id": 10,
        "file_name": "COCO_val2014_000000000001.jpg",
        "width": 40,
        "height": 30,
        "captions": {"en": "A red image."},
    }
    png = samples[2][1]["jpg"]  # a PNG under a .jpg name is re-encoded
    img = Image.open(io.BytesIO(png))
    assert img.format == "JPEG" and img.size == (20, 20)
    assert np.abs(np.asarray(img, np.int16) - [10, 200, 10]).max() < 8


def test_coco_captions_with_regions(coco: tuple[Path, Path], tmp_path: Path) -> None:
    captions, images = coco
    a = _regions(1, 40, 30, 4, 6)
    tsv = tmp_path / "feats.tsv"
    tsv.write_text(_lxmert_row(a, "COCO_val2014_000000000001") + "\n", encoding="utf-8")
    stats = cvl.convert_coco_captions(captions, images, tmp_path / "o", split="v", regions_tsv=tsv)
    assert stats["written"] == 2 and stats["skipped"]["missing_regions"] == 1  # image 2
    for _, members in read_shard_samples(stats["shards"]):
        arrays = cvl.load_regions(members["regions.npz"])
        np.testing.assert_array_equal(arrays["features"], a["features"])
        np.testing.assert_allclose(arrays["boxes"], _normalised(a), rtol=1e-6)
        np.testing.assert_array_equal(arrays["labels"], a["labels"])
        assert arrays["image_size"].tolist() == [40, 30]


def test_coco_errors_name_the_file(tmp_path: Path, coco: tuple[Path, Path]) -> None:
    captions, images = coco
    with pytest.raises(FileNotFoundError, match="nope.json"):
        cvl.convert_coco_captions(tmp_path / "nope.json", images, tmp_path / "o", split="val")
    broken = tmp_path / "broken.json"
    broken.write_text('{"images": [', encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json"):
        cvl.convert_coco_captions(broken, images, tmp_path / "o", split="val")
    with pytest.raises(FileNotFoundError, match="no_images"):
        cvl.convert_coco_captions(captions, tmp_path / "no_images", tmp_path / "o", split="val")
    with pytest.raises(ValueError, match="split"):
        cvl.convert_coco_captions(captions, images, tmp_path / "o", split="../x")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------
# VQA v2

ANSWERS = ["2", "2", "two", "2", "3", "2", "2", "2", "2", "2"]


@pytest.fixture
def vqa(tmp_path: Path) -> tuple[Path, Path, Path]:
    images = tmp_path / "val2014"
    images.mkdir()
    for i in (5, 6):
        _image(images / f"COCO_val2014_{i:012d}.jpg", (i * 20, 0, 0), (16, 16), "JPEG")
    qs = [(5000, 5, "How many dogs?"), (5001, 5, "Is it red?"), (6000, 6, "What color?")]
    qs += [(7000, 7, "Where is the image?"), (5002, 5, "Not annotated?")]
    questions = {
        "info": {},
        "task_type": "Open-Ended",
        "data_type": "mscoco",
        "license": {},
        "data_subtype": "val2014",
        "questions": [{"image_id": i, "question": q, "question_id": n} for n, i, q in qs],
    }
    answers = {5000: ANSWERS, 5001: ["yes"] * 9 + ["no"], 6000: ["red"] * 10, 7000: ["x"] * 10}
    types = {5000: "number", 5001: "yes/no", 6000: "other", 7000: "other"}
    anns = [
        {
            "question_id": n,
            "image_id": n // 1000,
            "question_type": "how many" if n == 5000 else "what",
            "answer_type": types[n],
            "multiple_choice_answer": ans[0],
            "answers": [
                {"answer": a, "answer_confidence": "yes", "answer_id": k + 1}
                for k, a in enumerate(ans)
            ],
        }
        for n, ans in answers.items()
    ]
    q_path = tmp_path / "v2_OpenEnded_mscoco_val2014_questions.json"
    a_path = tmp_path / "v2_mscoco_val2014_annotations.json"
    q_path.write_text(json.dumps(questions), encoding="utf-8")
    a_path.write_text(json.dumps({"info": {}, "annotations": anns}), encoding="utf-8")
    return q_path, a_path, images


def test_vqa_with_images(vqa: tuple[Path, Path, Path], tmp_path: Path) -> None:
    questions, annotations, images = vqa
    stats = cvl.convert_vqa(questions, annotations, images, tmp_path / "out", split="val")
    assert stats["written"] == 3
    assert stats["skipped"] == {"missing_image": 1, "no_annotation": 1}
    assert stats["skipped_items"]["no_annotation"] == ["question 5002"]
    assert "COCO_val2014_000000000007.jpg" in stats["skipped_items"]["missing_image"][0]
    samples = read_shard_samples(stats["shards"])
    assert [k for k, _ in samples] == ["5000", "5001", "6000"]
    _, members = samples[0]
    assert set(members) == {"jpg", "json"}
    assert members["jpg"] == (images / "COCO_val2014_000000000005.jpg").read_bytes()
    assert json.loads(members["json"]) == {
        "question": "How many dogs?",
        "question_id": 5000,
        "image_id": 5,
        "answers": ANSWERS,  # raw and in order: "two" is not normalised here
        "answer_type": "number",
        "question_type": "how many",
        "multiple_choice_answer": "2",
    }
    assert json.loads(samples[1][1]["json"])["answers"] == ["yes"] * 9 + ["no"]


def test_vqa_test_split_and_regions_only(vqa: tuple[Path, Path, Path], tmp_path: Path) -> None:
    questions, _, _ = vqa
    recs = {i: _regions(i, 16, 16, 2, 4) for i in (5, 7)}
    tsv = tmp_path / "butd.tsv"
    tsv.write_text("".join(_butd_row(r) + "\n" for r in recs.values()), encoding="utf-8")
    stats = cvl.convert_vqa(questions, None, None, tmp_path / "out", split="test", regions_tsv=tsv)
    assert stats["written"] == 4 and stats["skipped"] == {"missing_regions": 1}  # image 6
    samples = read_shard_samples(stats["shards"])
    assert [k for k, _ in samples] == ["5000", "5001", "7000", "5002"]
    for _, members in samples:
        assert set(members) == {"regions.npz", "json"}
        meta = json.loads(members["json"])
        assert meta["answers"] == [] and "answer_type" not in meta
        np.testing.assert_array_equal(
            cvl.load_regions(members["regions.npz"])["features"], recs[meta["image_id"]]["features"]
        )


def test_vqa_errors(vqa: tuple[Path, Path, Path], tmp_path: Path) -> None:
    questions, annotations, images = vqa
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="image_dir or regions_tsv"):
        cvl.convert_vqa(questions, annotations, None, out, split="val")
    with pytest.raises(ValueError, match="'questions'"):
        cvl.convert_vqa(annotations, None, images, out, split="val")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        cvl.convert_vqa(questions, tmp_path / "missing.json", images, out, split="val")
    with pytest.raises(FileNotFoundError, match="feats.tsv"):
        cvl.convert_vqa(questions, None, None, out, split="val", regions_tsv=tmp_path / "feats.tsv")
    with pytest.raises(ValueError, match="image_name"):
        cvl.convert_vqa(questions, None, images, out, split="val", image_name="{file}.jpg")
    assert not out.exists()
    # another naming scheme through image_name
    (images / "COCO_val2014_000000000005.jpg").rename(images / "5.jpg")
    stats = cvl.convert_vqa(questions, None, images, out, split="val", image_name="{image_id}.jpg")
    assert stats["written"] == 3 and stats["skipped"] == {"missing_image": 2}
