"""ShardWriter: round trips, determinism, rollover, key checks, atomic publication."""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
from pathlib import Path

import pytest
import webdataset as wds

from mmptm.data.shards import ShardWriter


def _samples(n: int) -> list[dict]:
    return [
        {
            "__key__": f"s{i:04d}",
            "jpg": bytes([i % 256]) * (10 + i),
            "txt": f"caption {i} – ünïcode",
            "json": {"b": i, "a": [i, "é"]},
            "cls": [i, i + 1],
        }
        for i in range(n)
    ]


def _write(folder: Path, samples: list[dict], max_count: int) -> ShardWriter:
    with ShardWriter(str(folder / "train-%06d.tar"), max_count) as writer:
        for s in samples:
            writer.write(s)
    return writer


def _expected_bytes(sample: dict) -> dict[str, bytes]:
    out = {}
    for ext, value in sample.items():
        if ext == "__key__":
            continue
        if isinstance(value, bytes):
            out[ext] = value
        elif isinstance(value, str):
            out[ext] = value.encode("utf-8")
        else:
            out[ext] = json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8")
    return out


def test_round_trip_through_tarfile(tmp_path: Path) -> None:
    samples = _samples(5)
    writer = _write(tmp_path, samples, max_count=100)
    assert writer.count == 5 and len(writer.shards) == 1
    with tarfile.open(writer.shards[0]) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        expected_names = [f"{s['__key__']}.{ext}" for s in samples for ext in s if ext != "__key__"]
        assert names == expected_names  # sample order, then field order
        for m in members:
            assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == (0, 0, 0, "", "", 0o444)
            assert m.isreg()
        got = {m.name: tar.extractfile(m).read() for m in members}
    for s in samples:
        for ext, data in _expected_bytes(s).items():
            assert got[f"{s['__key__']}.{ext}"] == data
    # dict members are JSON with sorted keys and real (not escaped) non-ASCII characters
    assert got["s0001.json"].decode("utf-8") == '{"a": [1, "é"], "b": 1}'


def test_round_trip_through_webdataset(tmp_path: Path) -> None:
    samples = _samples(7)
    writer = _write(tmp_path, samples, max_count=3)
    read = list(wds.WebDataset(writer.shards, shardshuffle=False))
    assert [r["__key__"] for r in read] == [s["__key__"] for s in samples]
    for r, s in zip(read, samples):
        fields = {k: v for k, v in r.items() if not k.startswith("__")}
        assert fields == _expected_bytes(s)


def test_identical_input_gives_identical_bytes(tmp_path: Path) -> None:
    samples = _samples(9)
    a = _write(tmp_path / "a", samples, max_count=4)
    b = _write(tmp_path / "b", samples, max_count=4)

    def digest(paths: list[str]) -> list[str]:
        return [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]

    assert len(a.shards) == 3
    assert digest(a.shards) == digest(b.shards)
    c = _write(tmp_path / "c", [*samples[:-1], {**samples[-1], "txt": "changed"}], max_count=4)
    assert digest(c.shards)[:2] == digest(a.shards)[:2]
    assert digest(c.shards)[2] != digest(a.shards)[2]


def test_rollover_at_max_count(tmp_path: Path) -> None:
    writer = _write(tmp_path, _samples(7), max_count=3)
    assert writer.count == 7
    assert writer.shards == [str(tmp_path / f"train-{i:06d}.tar") for i in range(3)]
    per_shard = []
    for path in writer.shards:
        with tarfile.open(path) as tar:
            per_shard.append(len({m.name.split(".")[0] for m in tar.getmembers()}))
    assert per_shard == [3, 3, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == [Path(p).name for p in writer.shards]


def test_exact_multiple_leaves_no_empty_shard(tmp_path: Path) -> None:
    writer = _write(tmp_path, _samples(6), max_count=3)
    assert len(writer.shards) == 2
    assert _write(tmp_path / "none", [], max_count=3).shards == []


@pytest.mark.parametrize("key", ["", "a.b", "dir/name", "x.jpg", None, 12])
def test_bad_keys_are_rejected_with_the_key(tmp_path: Path, key: object) -> None:
    with ShardWriter(str(tmp_path / "s-%06d.tar"), 10) as writer:
        with pytest.raises(ValueError, match="invalid sample key") as err:
            writer.write({"__key__": key, "txt": "x"})
        assert repr(key) in str(err.value)


def test_bad_extensions_and_values_are_rejected(tmp_path: Path) -> None:
    with ShardWriter(str(tmp_path / "s-%06d.tar"), 10) as writer:
        with pytest.raises(ValueError, match="JPG"):
            writer.write({"__key__": "k", "JPG": b""})
        with pytest.raises(ValueError, match="no fields"):
            writer.write({"__key__": "k"})
        with pytest.raises(TypeError, match="int"):
            writer.write({"__key__": "k", "cls": 3})
    assert writer.count == 0


def test_metadata_fields_are_not_stored(tmp_path: Path) -> None:
    writer = _write(tmp_path, [{"__key__": "k", "__url__": "x.tar", "txt": "hi"}], max_count=5)
    with tarfile.open(writer.shards[0]) as tar:
        assert tar.getnames() == ["k.txt"]


def test_bad_pattern_and_count(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="%d"):
        ShardWriter(str(tmp_path / "train.tar"), 10)
    with pytest.raises(ValueError, match="max_count"):
        ShardWriter(str(tmp_path / "train-%06d.tar"), 0)


def test_shards_appear_only_when_complete(tmp_path: Path) -> None:
    samples = _samples(5)
    with (
        pytest.raises(RuntimeError, match="boom"),
        ShardWriter(str(tmp_path / "train-%06d.tar"), 3) as writer,
    ):
        for i, s in enumerate(samples):
            writer.write(s)
            if i == 1:  # first shard still open: nothing under a final name yet
                assert not (tmp_path / "train-000000.tar").exists()
            if i == 3:
                raise RuntimeError("boom")
    # the full first shard was published; the interrupted second one left nothing behind
    assert [p.name for p in tmp_path.iterdir()] == ["train-000000.tar"]
    assert writer.shards == [str(tmp_path / "train-000000.tar")]
    with tarfile.open(writer.shards[0]) as tar:
        assert len(tar.getmembers()) == 3 * 4


def test_check_shard_finds_the_damage_a_streaming_reader_stops_at_silently(
    tmp_path: Path,
) -> None:
    from mmptm.data.shards import SkipCounter, check_shard, tar_samples

    (url,) = _write(tmp_path, _samples(20), 100).shards
    data = Path(url).read_bytes()
    assert check_shard(url).error is None and check_shard(url).samples == 20
    with tarfile.open(url) as tar:
        seventh = next(m for m in tar.getmembers() if m.name.startswith("s0007.")).offset
    variants = {
        "header": data[:seventh],  # cut where a header starts: no reader error at all
        "garbage": data[:seventh] + b"\x07garbage" * 1000 + data[seventh:],
        "inside": data[: seventh + 700],  # inside the member's data
        "in_header": data[: seventh + 100],
    }
    found = {}
    for name, damaged in variants.items():
        path = tmp_path / f"{name}.tar"
        path.write_bytes(damaged)
        counter = SkipCounter()
        streamed = [s["__key__"] for s in tar_samples([str(path)], counter)]
        found[name] = (len(streamed), counter.count, check_shard(str(path)))
    n, errors, header = found["header"]
    assert (n, errors) == (7, 0) and header.samples == 7 and header.offset == seventh
    assert "no end-of-archive marker" in header.error
    n, errors, garbage = found["garbage"]
    assert (n, errors) == (7, 0) and (garbage.samples, garbage.lost) == (7, 13)
    assert garbage.offset == seventh and "13 samples past it are lost" in garbage.error
    _, errors, inside = found["inside"]
    assert errors >= 1 and inside.error.startswith("cut short") and inside.samples == 8
    n, errors, in_header = found["in_header"]
    assert (n, errors) == (7, 0) and in_header.error.endswith("inside a tar header")
    gz = tmp_path / "packed.tar.gz"
    gz.write_bytes(gzip.compress(data))
    assert check_shard(str(gz)).samples == 20 and check_shard(str(gz)).error is None
    (tmp_path / "empty.tar").write_bytes(b"")
    assert check_shard(str(tmp_path / "empty.tar")).error == "an empty file"
    (tmp_path / "text.tar").write_text("not a tar\n" * 100)
    assert check_shard(str(tmp_path / "text.tar")).error.startswith("not a tar file")


def test_training_reader_counts_what_silent_damage_loses(tmp_path: Path) -> None:
    """Garbage inside a shard: the streaming reader stops there without an error; the
    training reader counts the 13 samples past it (and a shard cut at a header as one)."""
    from mmptm.data.pipeline import reader_samples
    from mmptm.data.shards import SkipCounter

    (url,) = _write(tmp_path, _samples(20), 100).shards
    data = Path(url).read_bytes()
    with tarfile.open(url) as tar:
        seventh = next(m for m in tar.getmembers() if m.name.startswith("s0007.")).offset
    garbage, cut = tmp_path / "garbage.tar", tmp_path / "cut.tar"
    garbage.write_bytes(data[:seventh] + b"\x07garbage" * 1000 + data[seventh:])
    cut.write_bytes(data[:seventh])
    for path, lost in ((garbage, 13), (cut, 1), (Path(url), 0)):
        counter = SkipCounter()
        keys = [s["__key__"] for s in reader_samples([str(path)], 0, 1, 0, 1, counter)]
        assert len(keys) == (7 if lost else 20) and counter.count == lost
    quiet = SkipCounter(report=False)  # another reader reports this shard
    assert len(list(reader_samples([str(garbage)], 0, 1, 0, 1, quiet))) == 7
    assert quiet.count == 0
