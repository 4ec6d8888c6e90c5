"""Random access to one sample of a shard equals what the sequential reader gives."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from mmptm.data.shards import ShardWriter, SkipCounter, read_sample, tar_samples


def test_read_sample_equals_the_sequential_reader(tmp_path):
    with ShardWriter(tmp_path / "s-%03d.tar", 3) as w:
        for i in range(5):
            w.write(
                {"__key__": f"k{i}", "txt": f"text {i}", "json": {"i": i}, "bin": bytes(600 * i)}
            )
    # a shard from elsewhere: a folder in the member names, upper-case extensions
    odd = tmp_path / "odd.tar"
    with tarfile.open(odd, "w") as tar:
        for name, data in [("a/b.JPG", b"jpeg"), ("a/b.txt", b"t"), ("c.cls.txt", b"x" * 700)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for url in [*w.shards, str(odd)]:
        samples = list(tar_samples([url], SkipCounter()))
        assert samples
        for sample in samples:
            assert read_sample(url, sample["__key__"]) == sample
    assert read_sample(str(odd), "a/b")["jpg"] == b"jpeg"
    with pytest.raises(KeyError, match="'k9'"):
        read_sample(w.shards[0], "k9")
    # a rewritten shard is read afresh (the header cache is per file version)
    with ShardWriter(tmp_path / "s-%03d.tar", 10) as w2:
        w2.write({"__key__": "new", "txt": "fresh"})
    os.utime(w2.shards[0], (1, 1))
    assert read_sample(w2.shards[0], "new")["txt"] == b"fresh"
    with pytest.raises(FileNotFoundError):
        read_sample(str(tmp_path / "gone.tar"), "k0")
