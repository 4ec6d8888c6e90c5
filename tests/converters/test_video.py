"""Video converters: MSR-VTT, caption CSVs over videos and over features, round trips."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import av
import numpy as np
import pytest
import webdataset as wds

from mmptm.cli import main as cli_main
from mmptm.converters.video import (
    convert_msrvtt,
    convert_video_csv,
    convert_video_features,
    load_features,
    probe_video,
)
from mmptm.modalities.video import encode_video


def _clip(seed: int, frames: int = 4, size: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, size, size, 3), dtype=np.uint8)


def _decode(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _read(shards: list[str]) -> list[dict]:
    return list(wds.WebDataset(shards, shardshuffle=False))


# ---------------------------------------------------------------------------------------------
# MSR-VTT


@pytest.fixture
def msrvtt(tmp_path: Path) -> tuple[Path, Path]:
    videos = tmp_path / "videos"
    videos.mkdir()
    entries, sentences = [], []
    splits = {0: "train", 1: "train", 2: "validate", 3: "test", 4: "test", 5: "test"}
    for i, split in splits.items():
        vid = f"video{i}"
        entries.append({"category": i, "url": f"https://example.com/{i}", "video_id": vid,
                        "start time": 1.5, "end time": 9.0, "split": split, "id": i})  # fmt: skip
        if i != 4:  # video4 was not downloaded
            (videos / f"{vid}.mp4").write_bytes(encode_video(_clip(i), 8))
        for k in (2, 0, 1):  # sen_ids out of order in the file
            sentences.append({"caption": f"caption {k} of {vid}", "video_id": vid,
                              "sen_id": 100 * i + k})  # fmt: skip
    sentences.append({"caption": "", "video_id": "video0", "sen_id": 9999})
    ann = tmp_path / "videodatainfo.json"
    ann.write_text(json.dumps({"info": {}, "videos": entries, "sentences": sentences}))
    return videos, ann


def test_msrvtt_round_trip(msrvtt: tuple[Path, Path], tmp_path: Path) -> None:
    videos, ann = msrvtt
    stats = convert_msrvtt(videos, ann, tmp_path / "out", split="all", shard_size=2)
    assert stats["written"] == 5 and stats["skipped"] == {"bad_sentence": 1, "missing_video": 1}
    assert stats["skipped_items"]["missing_video"] == ["video4"]
    assert [Path(p).name for p in stats["shards"]] == [f"all-00000{i}.tar" for i in range(3)]
    samples = _read(stats["shards"])
    assert [s["__key__"] for s in samples] == ["video0", "video1", "video2", "video3", "video5"]
    for s in samples:
        i = int(s["__key__"].removeprefix("video"))
        meta = json.loads(s["json"])
        assert s["mp4"] == (videos / f"video{i}.mp4").read_bytes()  # stored, not re-encoded
        assert _decode(s["mp4"]).shape == (4, 16, 16, 3)
        expected = [f"caption {k} of video{i}" for k in range(3)]
        assert meta["captions"] == {"en": expected} and s["txt"].decode() == expected[0]
        assert meta["sen_ids"] == [100 * i + k for k in range(3)]
        assert meta["video_id"] == s["__key__"] and meta["start_time"] == 1.5


def test_msrvtt_split_and_keys(msrvtt: tuple[Path, Path], tmp_path: Path) -> None:
    videos, ann = msrvtt
    val = convert_msrvtt(videos, ann, tmp_path / "val", split="val")
    assert [s["__key__"] for s in _read(val["shards"])] == ["video2"]
    assert Path(val["shards"][0]).name == "val-000000.tar"
    keys = tmp_path / "test_1kA.txt"
    keys.write_text("# 1k-A\nvideo5\n\nvideo3\nvideo4\nvideo1\nvideo77\n")
    test = convert_msrvtt(videos, ann, tmp_path / "test", split="test", keys=keys)
    assert [s["__key__"] for s in _read(test["shards"])] == ["video5", "video3"]  # keys' order
    assert test["skipped"] == {"bad_sentence": 1, "missing_video": 1, "unknown_video": 1}
    assert test["skipped_items"]["unknown_video"] == ["video77"]


def test_msrvtt_logs_one_line_per_reason(
    msrvtt: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    videos, ann = msrvtt
    for i in range(4):
        (videos / f"video{i}.mp4").unlink()
    with caplog.at_level(logging.WARNING):
        stats = convert_msrvtt(videos, ann, tmp_path / "out")
    assert stats["written"] == 1 and stats["skipped"]["missing_video"] == 5
    lines = [r.getMessage() for r in caplog.records if "missing_video" in r.getMessage()]
    assert lines == [f"{ann}: skipped 5 (missing_video): video0, video1, video2, video3, video4"]


@pytest.mark.parametrize(
    ("content", "kwargs", "match"),
    [
        ("not json", {}, "not valid JSON"),
        ('{"sentences": []}', {}, "videos"),
        ('{"videos": []}', {}, "sentences"),
        ('{"videos": [], "sentences": []}', {"split": "dev"}, "dev"),
        ('{"videos": [], "sentences": []}', {"shard_size": 0}, "shard_size"),
    ],
)
def test_msrvtt_bad_input(tmp_path: Path, content: str, kwargs: dict, match: str) -> None:
    ann = tmp_path / "a.json"
    ann.write_text(content)
    with pytest.raises(ValueError, match=match):
        convert_msrvtt(tmp_path, ann, tmp_path / "out", **kwargs)
    with pytest.raises(FileNotFoundError, match="nope"):
        convert_msrvtt(tmp_path / "nope", ann, tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# Caption CSV over videos


@pytest.fixture
def video_folder(tmp_path: Path) -> Path:
    root = tmp_path / "clips"
    (root / "sub").mkdir(parents=True)
    (root / "a.mp4").write_bytes(encode_video(_clip(1), 8, "mp4"))
    (root / "sub" / "b.webm").write_bytes(encode_video(_clip(2), 8, "webm"))
    (root / "c.mkv").write_bytes(encode_video(_clip(3), 8, "mkv"))
    (root / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 50)
    (root / "notes.txt").write_text("not a video")
    return root


def test_video_csv_round_trip(video_folder: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.mp4").write_bytes((video_folder / "a.mp4").read_bytes())
    csv_path = tmp_path / "captions.csv"
    csv_path.write_text(
        "file,caption,language,source\n"
        "a.mp4,a dog runs,en,web\n"
        "sub/b.webm,a cat sleeps,en,web\n"
        'a.mp4,"a dog, running",en,web\n'
        "a.mp4,ein Hund rennt,de,web\n"
        "c.mkv,eine Katze,de,tv\n"
        "broken.mp4,never,en,web\n"
        "missing.mp4,never,en,web\n"
        "notes.txt,never,en,web\n"
        "../outside.mp4,escapes,en,web\n"
        ",no file,en,web\n"
    )
    stats = convert_video_csv(csv_path, video_folder, tmp_path / "out", shard_size=10)
    assert stats["written"] == 3
    assert stats["skipped"] == {
        "empty": 1,
        "unreadable_video": 1,
        "missing_video": 1,
        "unsupported_file": 2,
    }
    assert stats["skipped_items"]["missing_video"] == ["missing.mp4"]
    assert "broken.mp4" in stats["skipped_items"]["unreadable_video"][0]
    samples = {s["__key__"]: s for s in _read(stats["shards"])}
    assert list(samples) == ["a", "sub_b", "c"]
    a, b, c = samples["a"], samples["sub_b"], samples["c"]
    assert a["mp4"] == (video_folder / "a.mp4").read_bytes()
    assert b["webm"] == (video_folder / "sub" / "b.webm").read_bytes()
    assert c["mkv"] == (video_folder / "c.mkv").read_bytes()
    for s, ext in ((a, "mp4"), (b, "webm"), (c, "mkv")):
        np.testing.assert_array_equal(_decode(s[ext]).shape, (4, 16, 16, 3))
    meta = json.loads(a["json"])
    assert meta == {
        "file": "a.mp4",
        "source": "web",
        "captions": {"en": ["a dog runs", "a dog, running"], "de": ["ein Hund rennt"]},
    }
    assert a["txt"].decode() == "a dog runs" and c["txt"].decode() == "eine Katze"


def test_video_csv_split_column_and_no_probe(video_folder: Path, tmp_path: Path) -> None:
    csv_path = tmp_path / "captions.csv"
    csv_path.write_text("file,caption,split\na.mp4,one,train\nbroken.mp4,two,val\nc.mkv,3,val\n")
    val = convert_video_csv(csv_path, video_folder, tmp_path / "val", split="val", probe=False)
    assert [s["__key__"] for s in _read(val["shards"])] == ["broken", "c"]  # not probed
    assert Path(val["shards"][0]).name == "val-000000.tar"
    with pytest.raises(ValueError, match="broken.mp4"):
        probe_video(video_folder / "broken.mp4")
    probe_video(video_folder / "sub" / "b.webm")


def test_video_csv_needs_file_and_caption_columns(video_folder: Path, tmp_path: Path) -> None:
    csv_path = tmp_path / "captions.csv"
    csv_path.write_text("path,text\na.mp4,x\n")
    with pytest.raises(ValueError, match="'file' and 'caption'"):
        convert_video_csv(csv_path, video_folder, tmp_path / "out")


# ---------------------------------------------------------------------------------------------
# Caption CSV over features


def test_video_features_round_trip(tmp_path: Path) -> None:
    feats = tmp_path / "feats"
    feats.mkdir()
    rng = np.random.default_rng(0)
    good = {n: rng.standard_normal((t, 6)).astype(dt) for n, t, dt in
            (("a", 5, np.float32), ("b", 3, np.float16), ("c", 7, np.float64))}  # fmt: skip
    for name, array in good.items():
        np.save(feats / f"{name}.npy", array)
    np.save(feats / "nan.npy", np.array([[0.0, np.nan]], np.float32))
    np.save(feats / "flat.npy", np.zeros(6, np.float32))
    np.save(feats / "wide.npy", np.zeros((2, 9), np.float32))
    np.save(feats / "ints.npy", np.zeros((2, 6), np.int64))
    (feats / "junk.npy").write_bytes(b"not numpy")
    csv_path = tmp_path / "captions.csv"
    rows = ["a.mp4,clip a", "b.npy,clip b", "a.mp4,clip a again", "c.webm,clip c"]
    rows += [f"{n}.npy,bad" for n in ("nan", "flat", "wide", "ints", "junk", "gone")]
    csv_path.write_text("file,caption\n" + "\n".join(rows) + "\n")
    stats = convert_video_features(csv_path, feats, tmp_path / "out")
    assert stats["written"] == 3 and stats["dim"] == 6
    assert stats["skipped"] == {"bad_features": 4, "wrong_dim": 1, "missing_features": 1}
    reasons = " | ".join(stats["skipped_items"]["bad_features"])
    for name, what in (("nan", "NaN"), ("flat", "shape"), ("ints", "int64"), ("junk", "npy")):
        assert f"{name}.npy: " in reasons and what in reasons
    samples = {s["__key__"]: s for s in _read(stats["shards"])}
    assert list(samples) == ["a", "b", "c"]
    for name, array in good.items():
        got = np.load(io.BytesIO(samples[name]["npy"]))
        assert got.dtype == (np.float32 if array.dtype == np.float64 else array.dtype)
        np.testing.assert_array_equal(got, array.astype(got.dtype))
        meta = json.loads(samples[name]["json"])
        assert (meta["frames"], meta["dim"]) == array.shape
    assert json.loads(samples["a"]["json"])["captions"] == {"en": ["clip a", "clip a again"]}
    with pytest.raises(ValueError, match="nan.npy: NaN"):
        load_features(feats / "nan.npy")


# ---------------------------------------------------------------------------------------------
# Command line


def test_cli_converters(
    msrvtt: tuple[Path, Path], video_folder: Path, tmp_path: Path, capsys
) -> None:
    videos, ann = msrvtt
    out = tmp_path / "ms"
    assert cli_main(["data", "msrvtt", "--videos", str(videos), "--annotations", str(ann),
                     "--out", str(out), "--split", "train"]) == 0  # fmt: skip
    printed = json.loads(capsys.readouterr().out)
    assert printed["written"] == 2 and "skipped_items" not in printed
    csv_path = tmp_path / "c.csv"
    csv_path.write_text("file,caption\na.mp4,x\n")
    assert cli_main(["data", "videos", "--csv", str(csv_path), "--video-dir", str(video_folder),
                     "--out", str(tmp_path / "v")]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["written"] == 1
    feats = tmp_path / "f"
    feats.mkdir()
    np.save(feats / "a.npy", np.ones((2, 3), np.float32))
    assert cli_main(["data", "video-features", "--csv", str(csv_path), "--features-dir",
                     str(feats), "--out", str(tmp_path / "vf")]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["dim"] == 3
    assert cli_main(["data", "videos", "--csv", str(tmp_path / "none.csv"), "--video-dir",
                     str(video_folder), "--out", str(tmp_path / "v")]) == 2  # fmt: skip
