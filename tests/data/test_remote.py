"""Shards from HTTP, ``pipe:`` commands and object storage, against a loopback HTTP server the
test starts on 127.0.0.1: brace specs, manifests, network faults (a 404, a cut connection, a
stalled one), the cache, and resampled shards with exact resume."""

from __future__ import annotations

import copy
import io
import json
import re
import tarfile
import threading
import time
from dataclasses import asdict, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmptm.data.manifest import MANIFEST, MissingManifest, manifest_url, shard_name
from mmptm.data.pipeline import DataState, Loader, ShardStream, single_pass, stream_config
from mmptm.data.remote import RemoteOptions, open_shard
from mmptm.data.shards import (
    ShardWriter,
    SkipCounter,
    count_samples,
    expand_shards,
    read_shard,
    tar_samples,
)
from mmptm.modalities import Need
from mmptm.recipe import DataConfig

#: what an image encoder of input size 16 declares: batches of pixels alone, no tokenizer
NEEDS = {"image": Need("image", {"size": 16, "mean": [0.5] * 3, "std": [0.5] * 3})}
FAST = RemoteOptions(retries=1, timeout_s=0.5, backoff_s=0.05)


def _jpg(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (i * 7 % 256, 40, 200)).save(buf, format="JPEG")
    return buf.getvalue()


def _sample(i: int) -> dict:
    lang = ("en", "de", "ru")[i % 3]
    return {"__key__": f"k{i:04d}", "jpg": _jpg(i), "txt": f"scene {i}", "json": {"language": lang}}


def write_shards(folder: Path, n: int, per_shard: int, manifest: bool = True) -> list[str]:
    """Toyworld-style shards (jpg, txt, json with a language) of samples k0000..."""
    with ShardWriter(str(folder / "s-%06d.tar"), per_shard, manifest=manifest) as w:
        for i in range(n):
            w.write(_sample(i))
    return w.shards


class Server:
    """A loopback HTTP server of a folder. Paths: ``/files/NAME`` (range requests answered
    with 206), ``/cut/NAME`` (the first answer stops at ``cut_at`` bytes, the connection
    closed; ``/cut-norange/NAME`` then ignores range requests), ``/stall/NAME``
    (``stall_at`` bytes, then nothing until the test ends), and anything missing answers
    404. ``requests`` records (path, Range header)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, str | None]] = []
        self.cut_at: dict[str, int] = {}
        self.stall_at: dict[str, int] = {}
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                server.requests.append((self.path, self.headers.get("Range")))
                server.answer(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        mode, _, name = h.path.lstrip("/").partition("/")
        path = self.root / name
        if not path.is_file():
            h.send_error(404, "Not Found")
            return
        data = path.read_bytes()
        start = 0
        if (rng := h.headers.get("Range")) and mode != "cut-norange":
            start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
        h.send_response(206 if start else 200)
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        if mode.startswith("cut") and rng is None and self.requests.count((h.path, None)) == 1:
            h.wfile.write(data[: self.cut_at[name]])  # then the connection closes
            h.close_connection = True
            return
        if mode == "stall":
            h.wfile.write(data[start : self.stall_at[name]])
            h.wfile.flush()
            self.release.wait(30)
            return
        h.wfile.write(data[start:])

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path)
    yield s
    s.close()


def _keys(samples) -> list[str]:
    return [s["__key__"] for s in samples]


def _offset_of(shard: str, key: str) -> int:
    """Byte offset of the first header of sample ``key`` in a shard."""
    with tarfile.open(shard) as tar:
        return next(m.offset for m in tar if m.name.startswith(key + "."))


# -- specs and manifests ----------------------------------------------------------------------


def test_remote_specs_are_brace_expanded_in_order():
    got = expand_shards(
        "http://127.0.0.1:1/a-{000001..000002}.tar, pipe:cat /d/b-{x,y}.tar,https://h/c.tar?sig=1"
    )
    assert got == [
        "http://127.0.0.1:1/a-000001.tar",
        "http://127.0.0.1:1/a-000002.tar",
        "pipe:cat /d/b-x.tar",
        "pipe:cat /d/b-y.tar",
        "https://h/c.tar?sig=1",
    ]
    with pytest.raises(ValueError, match=r"unknown protocol nosuch://"):
        expand_shards("nosuch://bucket/a.tar")


def test_object_storage_without_its_backend_is_one_line_naming_the_extra():
    pytest.importorskip("fsspec")
    try:
        import s3fs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("s3fs is installed")
    with pytest.raises(ValueError, match=r"s3://b/a.tar: reading s3:// .*mmptm\[remote\]") as e:
        expand_shards("s3://b/a.tar")
    assert "\n" not in str(e.value)


def test_where_a_manifest_lies():
    assert manifest_url("/d/s-000001.tar") == f"/d/{MANIFEST}"
    assert manifest_url("https://h/p/s-1.tar?sig=x") == f"https://h/p/{MANIFEST}"
    assert manifest_url("s3://b/p/s-1.tar") == f"s3://b/p/{MANIFEST}"
    cmd = "pipe:aws s3 cp s3://b/p/s-000001.tar - --quiet"
    assert manifest_url(cmd) == f"pipe:aws s3 cp s3://b/p/{MANIFEST} - --quiet"
    assert shard_name(cmd) == "s-000001.tar"
    with pytest.raises(MissingManifest, match="no word ending in .tar"):
        manifest_url("pipe:make-shard 3")


def test_shard_writers_add_their_shards_to_one_manifest(tmp_path):
    write_shards(tmp_path, 10, per_shard=4)  # s-000000..2: 4, 4, 2 samples
    with ShardWriter(str(tmp_path / "val-%06d.tar"), 5, manifest=True) as w:
        for i in range(3):
            w.write({"__key__": f"v{i}", "txt": "x", "json": {"languages": ["en", "de"]}})
    doc = json.loads((tmp_path / MANIFEST).read_text())
    assert doc["__kind__"] == "wids-shard-index-v1"  # webdataset's wids reads it as is
    entries = {e["url"]: e for e in doc["shardlist"]}
    assert sorted(entries) == ["s-000000.tar", "s-000001.tar", "s-000002.tar", "val-000000.tar"]
    assert [entries[f"s-00000{i}.tar"]["nsamples"] for i in range(3)] == [4, 4, 2]
    # samples 0..3 are en, de, ru, en; 8, 9: ru, en
    assert entries["s-000000.tar"]["languages"] == {"de": 1, "en": 2, "ru": 1}
    assert entries["s-000002.tar"]["languages"] == {"en": 1, "ru": 1}
    assert entries["val-000000.tar"]["languages"] == {"en-de": 3}
    for name, e in entries.items():
        assert e["filesize"] == (tmp_path / name).stat().st_size


def test_counts_come_from_the_manifest_while_it_matches_the_files(tmp_path):
    urls = write_shards(tmp_path, 10, per_shard=4)
    doc = json.loads((tmp_path / MANIFEST).read_text())
    doc["shardlist"][0]["nsamples"] = 1000  # proof that the manifest, not the tar, is read
    (tmp_path / MANIFEST).write_text(json.dumps(doc))
    assert count_samples(urls) == 1000 + 4 + 2
    doc["shardlist"][0]["filesize"] += 1  # counted a file of another size: read the tar
    (tmp_path / MANIFEST).write_text(json.dumps(doc))
    assert count_samples(urls) == 10
    (tmp_path / MANIFEST).unlink()
    assert count_samples(urls) == 10


def test_a_remote_spec_without_a_manifest_is_one_line_saying_how_to_write_it(tmp_path, server):
    write_shards(tmp_path, 8, per_shard=4, manifest=False)
    spec = f"{server.url}/files/s-{{000000..000001}}.tar"
    with pytest.raises(MissingManifest) as e:
        stream_config(DataConfig(train=spec, batch_size=2), None, needs=NEEDS)
    assert "\n" not in str(e.value)
    assert f"mmptm data manifest '{spec}'" in str(e.value)
    assert f"{server.url}/files/{MANIFEST}" in str(e.value)


def test_manifest_command_for_local_and_remote_shards(tmp_path, server, capsys):
    from mmptm.cli import main

    shards = tmp_path / "shards"
    shards.mkdir()
    server.root = shards
    write_shards(shards, 10, per_shard=4, manifest=False)
    assert main(["data", "manifest", str(shards / "s-*.tar"), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary[str(shards / MANIFEST)]["samples"] == 10
    assert summary[str(shards / MANIFEST)]["languages"] == {"de": 3, "en": 4, "ru": 3}
    local = json.loads((shards / MANIFEST).read_text())
    (shards / MANIFEST).unlink()

    spec = f"{server.url}/files/s-{{000000..000002}}.tar"
    assert main(["data", "manifest", spec, "--no-progress"]) == 2  # nowhere to write it
    assert "--out" in capsys.readouterr().err
    out = tmp_path / "remote.json"
    assert main(["data", "manifest", spec, "--out", str(out), "--no-progress"]) == 0
    remote = json.loads(out.read_text())
    for entry in local["shardlist"]:
        del entry["filesize"]  # not known of a remote shard
    assert remote == local
    (shards / MANIFEST).write_bytes(out.read_bytes())  # beside the shards: training reads it
    assert count_samples(expand_shards(spec)) == 10


def test_converters_write_the_manifest_when_asked(tmp_path, capsys):
    from mmptm.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence {i}\n" for i in range(7)), encoding="utf-8")
    argv = ["data", "text", "--input", str(corpus), "--lang", "fr", "--out", str(tmp_path / "o"),
            "--shard-size", "3"]  # fmt: skip
    assert main(argv) == 0
    assert not (tmp_path / "o" / MANIFEST).exists()  # asked for only
    assert main([*argv, "--manifest"]) == 0
    doc = json.loads((tmp_path / "o" / MANIFEST).read_text())
    assert [e["nsamples"] for e in doc["shardlist"]] == [3, 3, 1]
    assert sum(e["languages"].get("fr", 0) for e in doc["shardlist"]) == 7


# -- reading ----------------------------------------------------------------------------------


def test_http_and_pipe_shards_give_the_samples_of_the_local_files(tmp_path, server):
    urls = write_shards(tmp_path, 10, per_shard=4)
    expected = [_sample(i) for i in range(10)]
    handler = SkipCounter()
    http = list(tar_samples([f"{server.url}/files/{Path(u).name}" for u in urls], handler))
    pipe = list(tar_samples([f"pipe:cat {u}" for u in urls], handler))
    assert handler.count == 0
    for got in (http, pipe):
        assert _keys(got) == [s["__key__"] for s in expected]
        assert [s["jpg"] for s in got] == [s["jpg"] for s in expected]
        assert [s["txt"].decode() for s in got] == [s["txt"] for s in expected]
    spec = f"pipe:cat {tmp_path}/s-{{000000..000002}}.tar"  # its manifest through the command
    assert count_samples(expand_shards(spec)) == 10


def test_object_storage_shards_read_through_fsspec(tmp_path):
    """fsspec's in-memory file system stands in for s3:// (same code path, no backend)."""
    fsspec = pytest.importorskip("fsspec")
    urls = write_shards(tmp_path, 10, per_shard=4)
    fs = fsspec.filesystem("memory")
    for p in [*urls, str(tmp_path / MANIFEST)]:
        fs.pipe(f"/bucket/{Path(p).name}", Path(p).read_bytes())
    spec = "memory://bucket/s-{000000..000002}.tar"
    handler = SkipCounter()
    assert _keys(tar_samples(expand_shards(spec), handler, FAST)) == [
        f"k{i:04d}" for i in range(10)
    ]
    assert handler.count == 0 and count_samples(expand_shards(spec)) == 10
    assert _keys(read_shard("memory://bucket/gone.tar", handler, FAST, expected=3)) == []
    assert handler.count == 3 and "gone.tar" in handler.last


def test_a_pipe_spec_trains_like_its_files(tmp_path):
    urls = write_shards(tmp_path, 10, per_shard=4)
    batches = {}
    for name, spec in [
        ("files", ",".join(urls)),
        ("pipe", f"pipe:cat {tmp_path}/s-{{000000..000002}}.tar"),
    ]:
        sc = stream_config(DataConfig(val=spec, batch_size=3), None, needs=NEEDS, split="val")
        batches[name] = list(single_pass(sc))
    assert [b["__key__"] for b in batches["pipe"]] == [b["__key__"] for b in batches["files"]]
    for a, b in zip(batches["files"], batches["pipe"], strict=True):
        torch.testing.assert_close(a["pixels"], b["pixels"])


@pytest.mark.parametrize("mode", ["cut", "cut-norange"])
def test_a_cut_connection_goes_on_from_its_byte(tmp_path, server, mode):
    """A range request; a server that ignores it sends it all, and the start is dropped."""
    write_shards(tmp_path, 6, per_shard=6)
    server.cut_at["s-000000.tar"] = 3000
    handler = SkipCounter()
    got = list(read_shard(f"{server.url}/{mode}/s-000000.tar", handler, FAST, expected=6))
    assert handler.count == 0
    assert _keys(got) == [f"k{i:04d}" for i in range(6)]
    assert [s["jpg"] for s in got] == [_jpg(i) for i in range(6)]
    path = f"/{mode}/s-000000.tar"
    assert server.requests == [(path, None), (path, "bytes=3000-")]


def test_a_missing_and_a_stalled_shard_are_skipped_and_counted_in_seconds(tmp_path, server):
    urls = write_shards(tmp_path, 90, per_shard=30)  # 3 shards of 30
    server.stall_at["s-000001.tar"] = _offset_of(urls[1], "k0055")
    shards = [
        f"{server.url}/files/s-000000.tar",
        f"{server.url}/files/gone-000000.tar",  # 404
        f"{server.url}/stall/s-000001.tar",
        f"{server.url}/files/s-000002.tar",
    ]
    handler = SkipCounter()
    start = time.monotonic()
    got = [_keys(read_shard(u, handler, FAST, expected=30)) for u in shards]
    assert time.monotonic() - start < 5  # 0.5 s stalls, one retry: nothing hangs
    assert got[0] == [f"k{i:04d}" for i in range(30)] and got[1] == []
    assert got[3] == [f"k{i:04d}" for i in range(60, 90)]
    # the stalled shard gives samples up to the stall (the tar reader's last record before
    # it lost), and the rest of its 30 count as skipped, as do the missing shard's 30
    read = len(got[2])
    assert 0 < read < 25 and got[2] == [f"k{i:04d}" for i in range(30, 30 + read)]
    assert handler.count == 30 + (30 - read)
    assert "TimeoutError: no data for 0.5 s" in handler.last
    stalled = [r for r in server.requests if r[0].startswith("/stall/")]
    offset = server.stall_at["s-000001.tar"]
    assert stalled == [("/stall/s-000001.tar", None), ("/stall/s-000001.tar", f"bytes={offset}-")]
    assert server.requests.count(("/files/gone-000000.tar", None)) == 1  # a 404 is not retried


def test_the_cache_keeps_read_shards_within_its_bound(tmp_path, server):
    urls = write_shards(tmp_path, 12, per_shard=4)
    size = Path(urls[0]).stat().st_size
    cache = tmp_path / "cache"
    opts = replace(FAST, cache_dir=str(cache), cache_gb=2.5 * size / 1e9)  # room for 2
    remote = [f"{server.url}/files/{Path(u).name}" for u in urls]
    handler = SkipCounter()
    first = _keys(tar_samples(remote, handler, opts))
    assert len(first) == 12 and handler.count == 0
    kept = sorted(p.name for p in cache.iterdir())
    assert len(kept) == 2 and all(n.endswith(("s-000001.tar", "s-000002.tar")) for n in kept)
    for name in kept:  # byte for byte the shards served
        assert (cache / name).read_bytes() == (tmp_path / name.split("-", 1)[1]).read_bytes()
    before = len(server.requests)
    assert _keys(tar_samples(remote[1:], handler, opts)) == first[4:]
    assert len(server.requests) == before  # read from the cache
    with open_shard(remote[1], opts) as f:
        assert f.read() == Path(urls[1]).read_bytes()


# -- resampled shards -------------------------------------------------------------------------


def _resampled(urls: list[str], **kw) -> object:
    cfg = DataConfig(
        train=",".join(urls), batch_size=4, resampled=True, shuffle_buffer=kw.pop("buffer", 8),
        epoch_samples=kw.pop("epoch_samples", 0),
    )  # fmt: skip
    sc = stream_config(cfg, None, needs=NEEDS, seed=kw.pop("seed", 0), **kw)
    return replace(sc, remote=FAST)


@pytest.mark.parametrize("workers", [0, 2])
def test_resampled_epochs_are_counted_in_samples_and_resume_exactly(tmp_path, server, workers):
    write_shards(tmp_path, 24, per_shard=4)
    spec = f"{server.url}/files/s-{{000000..000005}}.tar"
    sc = _resampled(expand_shards(spec), epoch_samples=32)
    assert sc.epoch_samples == 32
    per_epoch = 32 // 4  # batches of 4 over all workers
    loader = Loader(sc, workers)
    it = iter(loader)
    epochs, batches = [], []
    for _ in range(2 * per_epoch + 3):
        batches.append(next(it))
        epochs.append(loader.state.epoch)
        if len(batches) == per_epoch + 3:
            saved = copy.deepcopy(asdict(loader.state))
    assert epochs == [0] * per_epoch + [1] * per_epoch + [2] * 3
    assert saved["epoch"] == 1 and saved["epoch_samples"] == 32
    resumed = Loader(sc, workers, DataState(**json.loads(json.dumps(saved))))
    again = [b for _, b in zip(range(per_epoch), resumed)]
    for a, b in zip(batches[per_epoch + 3 :], again, strict=True):
        assert a["__key__"] == b["__key__"]
        torch.testing.assert_close(a["pixels"], b["pixels"])
    first, second = (_keys_of(batches[e * per_epoch : (e + 1) * per_epoch]) for e in (0, 1))
    assert first != second  # each epoch draws anew


def _keys_of(batches) -> list[str]:
    return [k for b in batches for k in b["__key__"]]


def test_resampled_epoch_defaults_to_the_data_size_from_the_manifest(tmp_path):
    urls = write_shards(tmp_path, 24, per_shard=4)
    doc = json.loads((tmp_path / MANIFEST).read_text())
    for e in doc["shardlist"]:
        e["nsamples"] = 10  # the manifest, not the tars: 60
    (tmp_path / MANIFEST).write_text(json.dumps(doc))
    assert _resampled(urls).epoch_samples == 60
    assert _resampled(urls, epoch_samples=12).epoch_samples == 12


def test_an_older_endless_resampled_checkpoint_goes_on_endless(tmp_path):
    urls = write_shards(tmp_path, 8, per_shard=4)
    sc = _resampled(urls)  # 8 samples: an epoch would be 2 batches
    old = DataState(epoch=0, consumed=[3])  # written before epochs were counted
    loader = Loader(sc, 0, old)
    it = iter(loader)
    [next(it) for _ in range(5)]
    assert loader.state.epoch == 0 and loader.state.epoch_samples == 0
    reference = [b["__key__"] for _, b in zip(range(8), ShardStream(sc, epoch=0))]
    resumed = Loader(sc, 0, DataState(epoch=0, consumed=[3]))
    assert [b["__key__"] for _, b in zip(range(5), resumed)] == reference[3:8]


def test_a_resampled_stream_of_unreadable_shards_stops_with_an_error(tmp_path):
    urls = write_shards(tmp_path, 8, per_shard=4)
    (tmp_path / "s-000000.tar").write_bytes(b"not a tar" * 100)
    (tmp_path / "s-000001.tar").write_bytes(b"")
    from mmptm.data.pipeline import DataError

    sc = replace(_resampled(urls, epoch_samples=8), remote=FAST)
    with pytest.raises(DataError, match="shards drawn in a row gave no sample"):
        next(iter(Loader(sc, 0)))


def _draw_on_rank(rank: int, port: int, spec: str, out_dir: str) -> None:
    """One of two gloo ranks: 8 batches of resampled shards from the loopback server, the
    ranks agreeing on each epoch's end as the trainer's ranks do."""
    import torch.distributed as dist
    from conftest import rank_env

    from mmptm.train.trainer import leave_process_group

    rank_env(rank, port)
    dist.init_process_group("gloo")
    ok = False
    try:

        def agree(status: int) -> list[int]:
            mine = torch.tensor([status])
            every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(every, mine)
            return [int(s) for s in every]

        sc = _resampled(expand_shards(spec), epoch_samples=32, rank=rank, world=2)
        loader = Loader(sc, 0, agree=agree)
        rows = [(loader.state.epoch, b["__key__"]) for _, b in zip(range(8), loader)]
        torch.save(rows, Path(out_dir) / f"rank{rank}.pt")
        ok = True
    finally:
        leave_process_group(wait=ok)


def test_two_ranks_draw_their_own_resampled_streams(tmp_path, server):
    import torch.distributed as dist
    from conftest import free_port, spawn_ranks

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("needs gloo")
    shards = tmp_path / "shards"
    shards.mkdir()
    server.root = shards
    write_shards(shards, 24, per_shard=4)
    spec = f"{server.url}/files/s-{{000000..000005}}.tar"
    out = tmp_path / "out"
    out.mkdir()
    spawn_ranks(_draw_on_rank, (free_port(), spec, str(out)), deadline_s=120)
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    for rows in ranks:  # 32 samples an epoch: 4 batches of 4 on each of 2 ranks
        assert [epoch for epoch, _ in rows] == [0] * 4 + [1] * 4
    keys = [[k for _, batch in rows for k in batch] for rows in ranks]
    assert keys[0] != keys[1]
    assert all(a != b for (_, a), (_, b) in zip(*ranks, strict=True))  # no batch in common
    # each rank's stream is its (seed, rank, worker)'s: one process alone draws the same
    for rank in range(2):
        alone = Loader(_resampled(expand_shards(spec), epoch_samples=32, rank=rank, world=2), 0)
        assert [b["__key__"] for _, b in zip(range(8), alone)] == [b for _, b in ranks[rank]]


@pytest.mark.parametrize("workers", [0, 2])
def test_training_on_resampled_http_shards_resumes_exactly(tiny_world, tmp_path, server, workers):
    """A run of resampled shards served over HTTP, stopped at step 3 and resumed, reaches the
    losses of the run that was not stopped (the epochs of 24 samples cross the stop)."""
    from conftest import TEXT_MLM, text_mlm_overrides

    from mmptm.converters.manifest import write_manifests
    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import pretrain

    shards = tmp_path / "shards"
    shards.mkdir()
    for p in sorted((tiny_world / "image_text").glob("train-*.tar")):
        (shards / p.name).write_bytes(p.read_bytes())
    write_manifests(str(shards), progress=False)
    server.root = shards
    spec = f"{server.url}/files/train-{{000000..000005}}.tar"

    def run(out: Path, *extra: str) -> dict[int, float]:
        over = [*text_mlm_overrides(tiny_world, out), f"data.train={spec}", "data.resampled=true",
                "data.epoch_samples=24", f"data.num_workers={workers}", "train.max_steps=8",
                "train.ckpt_every=3", "data.timeout_s=5", *extra]  # fmt: skip
        pretrain(load_run_config(TEXT_MLM, over))
        rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in rows}

    full = run(tmp_path / "full")
    run(tmp_path / "split", "train.stop_at=4")
    resumed = run(tmp_path / "split", "resume=true")
    assert sorted(full) == sorted(resumed) == list(range(1, 9))
    assert resumed == full
