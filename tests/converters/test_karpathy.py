"""Karpathy's caption splits (dataset_coco.json, dataset_flickr30k.json): one sample an image
with every caption, train = train + restval, malformed entries skipped and named."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from conftest import read_shard_samples
from PIL import Image

from mmptm.cli import main as cli_main
from mmptm.converters import vl as cvl


def _jpg(path: Path, color: tuple[int, int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), color).save(path, format="JPEG")


def _sentences(*raws: object) -> list:
    return [{"raw": r, "tokens": [], "sentid": 100 + i} if isinstance(r, str) else r
            for i, r in enumerate(raws)]  # fmt: skip


def _coco_entry(imgid: int, cocoid: int, split: str, folder: str, *raws: object) -> dict:
    return {
        "filepath": folder,
        "filename": f"COCO_{folder}_{cocoid:012d}.jpg",
        "imgid": imgid,
        "split": split,
        "sentences": _sentences(*raws),
        "cocoid": cocoid,
    }


@pytest.fixture
def coco(tmp_path: Path) -> tuple[Path, Path]:
    """dataset_coco.json: entry i below is images[i]; the comments say what it tests."""
    images = tmp_path / "coco"
    entries = [
        _coco_entry(0, 11, "test", "val2014", "A man on a horse. ", "Someone riding."),  # 0
        _coco_entry(1, 12, "train", "train2014", "A dog.", "Two dogs.", "A dog runs.",
                    "A brown dog.", "Dogs!", "A dog outside.", "The dog."),  # 1: 7 captions
        _coco_entry(2, 13, "restval", "val2014", "Une tour — «Ла башня»."),  # 2: -> train
        _coco_entry(3, 14, "val", "val2014", "A red bus."),  # 3: no image file
        "not an entry",  # 4
        {"filepath": "val2014", "split": "val", "sentences": []},  # 5: no filename
        _coco_entry(6, 16, "extra", "val2014", "A cat."),  # 6: unknown split
        _coco_entry(7, 17, "val", "val2014", {"tokens": ["a"]}, "  ", "A kite."),  # 7
        _coco_entry(8, 18, "val", "val2014", "", 3),  # 8: no usable caption
        _coco_entry(9, 12, "train", "train2014", "Again image 12."),  # 9: repeated cocoid
        _coco_entry(10, 20, "val", "val2014", "A flat folder."),  # 10: image not in val2014/
        {**_coco_entry(11, 21, "test", "val2014", "x"), "sentences": "x"},  # 11: malformed
    ]  # fmt: skip
    for cocoid, folder in [(11, "val2014"), (12, "train2014"), (13, "val2014"), (17, "val2014")]:
        _jpg(images / folder / f"COCO_{folder}_{cocoid:012d}.jpg", (cocoid * 10, 0, 0))
    _jpg(images / "COCO_val2014_000000000020.jpg", (0, 200, 0))  # 10: found by file name
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": entries, "dataset": "coco"}), encoding="utf-8")
    return path, images


def _by_key(shards: list[str]) -> dict[str, dict[str, bytes]]:
    return dict(read_shard_samples(shards))


def test_karpathy_coco(
    coco: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, images = coco
    with caplog.at_level(logging.WARNING):
        stats = cvl.convert_karpathy(path, images, tmp_path / "out", shard_size=2)
    assert stats["splits"] == {"train": 2, "val": 2, "test": 1} and stats["written"] == 5
    assert stats["skipped"] == {
        "missing_image": 1, "malformed": 3, "unknown_split": 1, "bad_sentence": 2,
        "empty_caption": 2, "no_captions": 1, "duplicate_id": 1,
    }  # fmt: skip
    items = stats["skipped_items"]
    assert items["malformed"] == ["images[4]", "images[5]", "images[11]"]
    assert items["bad_sentence"] == ["images[7].sentences[0]", "images[8].sentences[1]"]
    assert items["missing_image"] == [
        f"images[3]: {images / 'COCO_val2014_000000000014.jpg'}"
    ]  # fmt: skip
    assert items["no_captions"] == ["images[8] (COCO_val2014_000000000018.jpg)"]
    assert items["duplicate_id"] == ["images[9] (image 12)"]
    assert f"{path}: images[3]: " in caplog.text  # the warning names the file and the entry
    names = sorted(Path(p).name for p in stats["shards"])
    assert names == ["test-000000.tar", "train-000000.tar", "val-000000.tar"]

    train = _by_key([p for p in stats["shards"] if Path(p).name.startswith("train")])
    assert list(train) == ["12", "13"]  # restval trains
    dog = train["12"]
    assert set(dog) == {"jpg", "txt", "json"}
    assert dog["jpg"] == (images / "train2014" / "COCO_train2014_000000000012.jpg").read_bytes()
    record = json.loads(dog["json"])
    assert record["captions"] == {"en": ["A dog.", "Two dogs.", "A dog runs.", "A brown dog.",
                                         "Dogs!", "A dog outside.", "The dog."]}  # fmt: skip
    assert record["image_id"] == 12 and record["split"] == "train" and record["imgid"] == 1
    assert record["sentids"] == list(range(100, 107)) and dog["txt"] == b"A dog."
    assert json.loads(train["13"]["json"])["captions"]["en"] == ["Une tour — «Ла башня»."]
    assert json.loads(train["13"]["json"])["split"] == "restval"
    val = _by_key([p for p in stats["shards"] if Path(p).name.startswith("val")])
    assert list(val) == ["17", "20"]
    assert json.loads(val["17"]["json"])["captions"] == {"en": ["A kite."]}
    assert json.loads(val["17"]["json"])["sentids"] == [102]
    assert val["20"]["jpg"] == (images / "COCO_val2014_000000000020.jpg").read_bytes()
    test = _by_key([p for p in stats["shards"] if Path(p).name.startswith("test")])
    assert json.loads(test["11"]["json"])["captions"]["en"] == [
        "A man on a horse.",
        "Someone riding.",
    ]


def test_karpathy_selected_splits_and_regions(coco: tuple[Path, Path], tmp_path: Path) -> None:
    path, _ = coco
    tsv = tmp_path / "feats.tsv"
    rng = np.random.default_rng(0)
    records = [
        {"image_id": i, "image_size": [8, 6], "features": rng.normal(size=(3, 4)).astype("f4"),
         "boxes": np.tile(np.float32([0, 0, 0.5, 0.5]), (3, 1))}
        for i in (12, 13, 17)
    ]  # fmt: skip
    cvl.write_butd_tsv(tsv, records, layout="butd")
    # regions only (no images): joined by the COCO id; image 11 (test) is not asked for
    stats = cvl.convert_karpathy(path, None, tmp_path / "o", splits=["train"], regions_tsv=tsv)
    assert stats["splits"] == {"train": 2}
    samples = _by_key(stats["shards"])
    assert list(samples) == ["12", "13"] and set(samples["12"]) == {"regions.npz", "txt", "json"}
    got = cvl.load_regions(samples["13"]["regions.npz"])
    np.testing.assert_array_equal(got["features"], records[1]["features"])


def test_karpathy_flickr30k(tmp_path: Path) -> None:
    images = tmp_path / "flickr30k-images"
    for stem in ("1000092795", "10002456"):
        _jpg(images / f"{stem}.jpg", (0, 0, 200))
    entries = [
        {"filename": "1000092795.jpg", "imgid": 0, "split": "train",
         "sentences": _sentences("Two young guys with shaggy hair.", "Two men outside.")},
        {"filename": "10002456.jpg", "imgid": 1, "split": "test",
         "sentences": _sentences("Several men in hard hats.")},
    ]  # fmt: skip
    path = tmp_path / "dataset_flickr30k.json"
    path.write_text(json.dumps({"images": entries, "dataset": "flickr30k"}), encoding="utf-8")
    stats = cvl.convert_karpathy(path, images, tmp_path / "out")
    assert stats["splits"] == {"train": 1, "val": 0, "test": 1} and stats["skipped"] == {}
    train = _by_key([p for p in stats["shards"] if "train" in Path(p).name])
    record = json.loads(train["1000092795"]["json"])
    assert record["image_id"] == 1000092795 and record["filepath"] is None
    assert record["captions"]["en"] == ["Two young guys with shaggy hair.", "Two men outside."]


def test_karpathy_errors(coco: tuple[Path, Path], tmp_path: Path) -> None:
    path, images = coco
    with pytest.raises(FileNotFoundError, match="nope.json"):
        cvl.convert_karpathy(tmp_path / "nope.json", images, tmp_path / "o")
    broken = tmp_path / "broken.json"
    broken.write_text('{"images": [', encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        cvl.convert_karpathy(broken, images, tmp_path / "o")
    broken.write_text('{"images": {}}', encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json: expected .* list under 'images'"):
        cvl.convert_karpathy(broken, images, tmp_path / "o")
    with pytest.raises(ValueError, match="unknown split 'restval'"):
        cvl.convert_karpathy(path, images, tmp_path / "o", splits=["restval"])
    with pytest.raises(ValueError, match="needs image_dir or regions_tsv"):
        cvl.convert_karpathy(path, None, tmp_path / "o")
    with pytest.raises(FileNotFoundError, match="no_images"):
        cvl.convert_karpathy(path, tmp_path / "no_images", tmp_path / "o")


def test_karpathy_command(coco: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    path, images = coco
    out = tmp_path / "cli"
    assert cli_main(["data", "karpathy", "--input", str(path), "--images", str(images),
                     "--out", str(out), "--splits", "val,test"]) == 0  # fmt: skip
    printed = json.loads(capsys.readouterr().out)
    assert printed["splits"] == {"val": 2, "test": 1} and "skipped_items" not in printed
    assert sorted(p.name for p in out.iterdir()) == ["test-000000.tar", "val-000000.tar"]
    assert cli_main(["data", "karpathy", "--input", str(tmp_path / "none.json"), "--images",
                     str(images), "--out", str(out)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "none.json" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
