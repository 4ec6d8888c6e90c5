"""Loader throughput from a loopback HTTP server against the same shards as local files.

Writes toyworld-style image-text shards (JPEG images of ``--image-size``, a caption, a json
with a language) and their manifest into a temporary folder, serves the folder with
``python -m http.server`` on 127.0.0.1 (its own process, so the server does not share this
process's interpreter lock), and times, in alternating rounds, one pass over the shards from
``local`` paths, ``http://`` URLs and ``pipe:cat`` commands:

- ``read``: tar → samples alone (what the remote reader adds shows here), samples/s and MB/s;
- ``loader``: the training loader (decode to ``--decode-size`` pixels, batches of
  ``--batch-size``) with ``--workers`` loader workers, samples/s.

It prints per round and then the medians and the ratios to ``local``.

    .venv/bin/python benchmarks/bench_remote_loader.py
    .venv/bin/python benchmarks/bench_remote_loader.py --samples 4000 --workers 2 --rounds 5
"""

from __future__ import annotations

import argparse
import io
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from mmptm.data.pipeline import single_pass, stream_config
from mmptm.data.remote import RemoteOptions
from mmptm.data.shards import ShardWriter, SkipCounter, expand_shards, tar_samples
from mmptm.modalities import Need
from mmptm.recipe import DataConfig


def write_shards(folder: Path, samples: int, per_shard: int, size: int) -> int:
    """Image-text shards with a manifest; returns their total bytes."""
    rng = np.random.default_rng(0)
    with ShardWriter(str(folder / "train-%06d.tar"), per_shard, manifest=True) as w:
        for i in range(samples):
            # smooth noise: JPEG sizes like photos' rather than flat colours'
            small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
            img = Image.fromarray(small).resize((size, size), Image.BILINEAR)
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=90)
            lang = ("en", "de", "fr")[i % 3]
            w.write({"__key__": f"s{i:07d}", "jpg": buf.getvalue(), "txt": f"scene {i}",
                     "json": {"language": lang}})  # fmt: skip
    return sum(Path(s).stat().st_size for s in w.shards)


def serve(folder: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
           "--directory", str(folder)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{url}/shardindex.json", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the loopback server did not start")


def read_pass(spec: str) -> int:
    handler = SkipCounter()
    n = sum(1 for _ in tar_samples(expand_shards(spec), handler, RemoteOptions()))
    assert handler.count == 0, handler.last
    return n


def loader_pass(spec: str, args: argparse.Namespace) -> int:
    needs = {"image": Need("image", {"size": args.decode_size, "mean": [0.5] * 3,
                                     "std": [0.5] * 3})}  # fmt: skip
    cfg = DataConfig(train=spec, batch_size=args.batch_size, num_workers=args.workers)
    sc = replace(stream_config(cfg, None, needs=needs), remote=RemoteOptions())
    return sum(len(b["__key__"]) for b in single_pass(sc, args.workers))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--per-shard", type=int, default=250)
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--decode-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print(f"{platform.node()} {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}, {args}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        nbytes = write_shards(folder, args.samples, args.per_shard, args.image_size)
        n_shards = -(-args.samples // args.per_shard)
        last = f"{n_shards - 1:06d}"
        print(f"{args.samples} samples in {n_shards} shards, {nbytes / 1e6:.1f} MB")
        proc, url = serve(folder)
        try:
            specs = {
                "local": f"{folder}/train-{{000000..{last}}}.tar",
                "http": f"{url}/train-{{000000..{last}}}.tar",
                "pipe:cat": f"pipe:cat {folder}/train-{{000000..{last}}}.tar",
            }
            tasks: dict[str, Callable[[str], int]] = {
                "read": read_pass,
                "loader": lambda spec: loader_pass(spec, args),
            }
            for task, fn in tasks.items():
                fn(specs["http"])  # warm-up: page cache, imports
                rates: dict[str, list[float]] = {name: [] for name in specs}
                for r in range(args.rounds):
                    line = []
                    for name, spec in specs.items():
                        t = time.perf_counter()
                        n = fn(spec)
                        dt = time.perf_counter() - t
                        assert n == args.samples, (name, n)
                        rates[name].append(n / dt)
                        line.append(f"{name}={n / dt:8.1f}/s ({nbytes / dt / 1e6:6.1f} MB/s)")
                    print(f"{task} round {r + 1}/{args.rounds}: " + "  ".join(line), flush=True)
                med = {name: statistics.median(v) for name, v in rates.items()}
                for name, m in med.items():
                    print(f"  {task:6} {name:9} median {m:8.1f} samples/s "
                          f"{m * nbytes / args.samples / 1e6:7.1f} MB/s  "
                          f"ratio to local {m / med['local']:.3f}")  # fmt: skip
        finally:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
