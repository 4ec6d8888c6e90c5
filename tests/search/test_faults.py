"""The fault suite's search side (``tests/train/test_faults.py`` has the runs'): shards that
are damaged under ``mmptm index`` are skipped and counted per shard, or refused with
``--strict``, and a build that fails leaves no half index; a damaged index file is one line
naming it (its size always checked, its checksum with ``--verify``), and a thumbnail that
does not read back is a clear JSON error, never an empty 200."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from conftest import cli_error
from fastapi.testclient import TestClient

from mmptm.cli import main
from mmptm.data.shards import ShardWriter, SkipCounter, expand_shards, tar_samples
from mmptm.search import index as search_index
from mmptm.search.index import SearchIndex, build_index
from mmptm.search.serve import create_app
from mmptm.search.store import DamagedIndex

GARBAGE = 20_000


def _write(folder: Path, name: str, samples: list[dict]) -> Path:
    with ShardWriter(folder / f"{name}-%d.tar", 1000) as w:
        for s in samples:
            w.write({k: v for k, v in s.items() if k != "__url__"})
    return folder / f"{name}-0.tar"


@pytest.fixture(scope="module")
def damaged(tiny_world, tmp_path_factory) -> dict[str, Path]:
    """Shards of toyworld's val scenes: one sound (8 samples), one with 20 kB of garbage a
    third of the way in (12), one cut in half (8), a zero-byte tar and a text file."""
    val = list(tar_samples(expand_shards(f"{tiny_world}/image_text/val-*.tar"), SkipCounter()))
    folder = tmp_path_factory.mktemp("damaged")
    shards = {"good": _write(folder, "good", val[:8])}
    shards["garbage"] = _write(folder, "garbage", val[8:20])
    data = shards["garbage"].read_bytes()
    third = len(data) // 3
    shards["garbage"].write_bytes(data[:third] + os.urandom(GARBAGE) + data[third:])
    shards["cut"] = _write(folder, "cut", val[20:28])
    with tarfile.open(shards["cut"]) as tar:  # cut inside the fifth sample's image
        at = tar.getmember(f"{val[24]['__key__']}.jpg").offset_data + 100
    shards["cut"].write_bytes(shards["cut"].read_bytes()[:at])
    shards["empty"] = folder / "empty.tar"
    shards["empty"].write_bytes(b"")
    shards["notes"] = folder / "notes.tar"
    shards["notes"].write_text("not a shard\n" * 100)
    return shards


def test_damaged_shards_are_skipped_and_counted_per_shard(
    tiny_clip_run, damaged, tmp_path, capsys, caplog
):
    out = tmp_path / "index"
    spec = f"{damaged['good'].parent}/*.tar"
    assert main(["index", str(tiny_clip_run), "--shards", spec, "--out", str(out),
                 "--batch-size", "4"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert "damaged shards: 4" in lines[0]
    report = {d.pop("shard"): d for d in summary["damaged"]}
    assert set(report) == {str(damaged[n]) for n in ("garbage", "cut", "empty", "notes")}
    # garbage: a tar reader stops at it without an error; the samples past it are counted
    garbage = report[str(damaged["garbage"])]
    size = damaged["garbage"].stat().st_size - GARBAGE
    assert garbage["samples"] == 12 and garbage["read"] + garbage["bad"] == 12
    streamed = len(list(tar_samples([str(damaged["garbage"])], SkipCounter())))
    assert garbage["read"] <= streamed < 12 and garbage["bad"] >= 12 - streamed
    assert "samples past it are lost" in garbage["error"]
    assert size // 3 <= garbage["offset"] < size // 3 + GARBAGE
    assert f"damaged at byte {garbage['offset']}" in garbage["error"]
    cut = report[str(damaged["cut"])]
    assert cut["error"].startswith("cut short") and cut["offset"] == damaged["cut"].stat().st_size
    assert cut["samples"] == 5 and cut["read"] == 4 and cut["bad"] == 1
    assert report[str(damaged["empty"])]["error"] == "an empty file"
    assert report[str(damaged["notes"])]["error"].startswith("not a tar file")
    # nothing lost silently: every sample is indexed or counted, shard by shard
    assert summary["skipped"]["bad"] == sum(r["bad"] for r in report.values())
    assert summary["added"] == 8 + garbage["read"] + cut["read"]
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert all(str(p) in warned for n, p in damaged.items() if n != "good")
    batch = json.loads((out / "index.json").read_text())["batches"][0]
    assert {d.pop("shard"): d for d in batch["damaged"]} == report
    assert batch["skipped"] == summary["skipped"]
    assert SearchIndex.open(out).info["items"] == summary["added"]


@pytest.mark.parametrize("name", ["garbage", "cut", "empty", "notes"])
def test_strict_refuses_a_damaged_shard_and_writes_nothing(
    tiny_clip_run, damaged, tmp_path, capsys, name
):
    out = tmp_path / "index"
    spec = f"{damaged['good']},{damaged[name]}"
    line = cli_error(
        capsys, ["index", str(tiny_clip_run), "--shards", spec, "--out", str(out), "--strict"]
    )
    assert str(damaged[name]) in line and "--strict" in line
    assert os.listdir(tmp_path) == []


def test_strict_refuses_a_sample_that_does_not_decode(tiny_clip_run, damaged, tmp_path, capsys):
    good = list(tar_samples([str(damaged["good"])], SkipCounter()))
    shard = _write(tmp_path, "photos", [*good[:3], {"__key__": "broken", "jpg": b"\xff\xd8 cut"}])
    out = tmp_path / "index"
    out.mkdir()  # an existing empty --out stays as it was
    argv = ["index", str(tiny_clip_run), "--shards", str(shard), "--out", str(out), "--strict"]
    line = cli_error(capsys, argv)
    assert f"{shard}: 1 of 4 samples could not be read or decoded" in line
    assert sorted(os.listdir(tmp_path)) == ["index", shard.name] and not any(out.iterdir())
    assert main(argv[:-1]) == 0  # without --strict: skipped and counted
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["added"] == 3 and summary["damaged"][0]["bad"] == 1
    assert summary["damaged"][0]["shard"] == str(shard)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_build_that_fails_leaves_no_half_index(
    tiny_clip_run, damaged, tmp_path, capsys, monkeypatch
):
    run, good = str(tiny_clip_run), str(damaged["good"])
    killed = tmp_path / ".index.building-999999999"  # a killed build's folder (no such pid)
    killed.mkdir()
    (killed / "items-00000.jsonl").write_text("{}\n")

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(search_index, "_write_parts", full_disk)
        line = cli_error(capsys, ["index", run, "--shards", good, "--out", str(tmp_path / "index")])
    assert "No space left on device" in line
    assert os.listdir(tmp_path) == []  # neither --out nor a build folder, the killed one gone
    build_index(run, good, tmp_path / "index", batch_size=4)
    before = _files(tmp_path / "index")
    cut = str(damaged["cut"])
    with monkeypatch.context() as m:
        m.setattr(search_index, "_write_parts", full_disk)
        line = cli_error(capsys, ["index", run, "--shards", cut, "--out", str(tmp_path / "index"),
                                  "--add"])  # fmt: skip
    assert "No space left on device" in line
    assert _files(tmp_path / "index") == before and os.listdir(tmp_path) == ["index"]


def _copy(index: Path, tmp_path: Path, name: str, *, old: bool = False) -> Path:
    """A copy of ``index``; ``old``: without the file records (an index of an older mmptm)."""
    copy = tmp_path / name
    shutil.copytree(index, copy)
    if old:
        meta = json.loads((copy / "index.json").read_text())
        del meta["files"]
        (copy / "index.json").write_text(json.dumps(meta))
    return copy


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_index_json_records_every_file_and_a_damaged_one_is_one_line(tiny_index, tmp_path, capsys):
    meta = json.loads((tiny_index / "index.json").read_text())
    named = [p[k] for p in meta["parts"] for k in ("index", "rows")]
    named += [b[k] for b in meta["batches"] for k in ("items", "thumbnails")]
    assert sorted(meta["files"]) == sorted(named)
    for name, record in meta["files"].items():
        data = (tiny_index / name).read_bytes()
        assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    faiss_file = meta["parts"][0]["index"]

    cut = _copy(tiny_index, tmp_path, "cut")
    _cut(cut / faiss_file)
    with pytest.raises(DamagedIndex, match=f"{faiss_file}: .* bytes where index.json records"):
        SearchIndex.open(cut)
    for argv in (["retrieve", str(cut), "a red circle"], ["serve", str(cut), "--port", "0"]):
        assert f"{cut / faiss_file}: " in cli_error(capsys, argv)

    thumbs = _copy(tiny_index, tmp_path, "thumbs")
    _cut(thumbs / "thumbs-00000.tar")
    with pytest.raises(DamagedIndex, match="thumbs-00000.tar: .* bytes where"):
        SearchIndex.open(thumbs)

    altered = _copy(tiny_index, tmp_path, "altered")  # same size, other bytes: --verify sees it
    data = bytearray((altered / faiss_file).read_bytes())
    data[-1] ^= 0xFF
    (altered / faiss_file).write_bytes(bytes(data))
    assert SearchIndex.open(altered).search_text("a red circle", k=2)
    with pytest.raises(DamagedIndex, match=f"{faiss_file}: its SHA-256 differs"):
        SearchIndex.open(altered, verify=True)
    for argv in (["retrieve", str(altered), "a red circle", "--verify"],
                 ["serve", str(altered), "--port", "0", "--verify"]):  # fmt: skip
        assert f"{altered / faiss_file}: its SHA-256 differs" in cli_error(capsys, argv)
    assert main(["retrieve", str(tiny_index), "a red circle", "--verify", "-k", "1"]) == 0


def test_an_old_index_opens_unverified_and_its_damage_is_still_named(
    tiny_index, tmp_path, capsys, caplog
):
    old = _copy(tiny_index, tmp_path, "old", old=True)
    _cut(old / "thumbs-00000.tar")
    with caplog.at_level("WARNING", logger="mmptm.search.store"):
        index = SearchIndex.open(old)
    assert "cannot be verified" in caplog.text
    client = TestClient(create_app(index), base_url="http://localhost")
    key = index.keys[-1]  # its thumbnail lies in the half cut off
    answer = client.get(f"/api/thumb/{key}")
    assert answer.status_code == 500 and answer.headers["content-type"] == "application/json"
    detail = answer.json()["detail"]
    assert "the index is damaged: thumbs-00000.tar holds 0 of the" in detail
    assert str(tmp_path) not in detail  # the server names no absolute path
    assert client.get(f"/api/thumb/{index.keys[0]}").status_code == 200

    faiss_file = json.loads((tiny_index / "index.json").read_text())["parts"][0]["index"]
    old = _copy(tiny_index, tmp_path, "old_faiss", old=True)
    _cut(old / faiss_file)
    with pytest.raises(DamagedIndex, match=f"{faiss_file}: not a readable FAISS index"):
        SearchIndex.open(old)
    line = cli_error(capsys, ["retrieve", str(old), "a red circle"])
    assert f"{old / faiss_file}: not a readable FAISS index" in line
