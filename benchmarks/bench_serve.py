"""Load test of ``mmptm serve``: N concurrent clients for T seconds of text search, 127.0.0.1.

The server runs as users run it, ``mmptm serve INDEX --port 0`` in a subprocess (so the load
generator does not share its interpreter). For each client count in ``--clients``, that many
threads, each with its own keep-alive httpx client, send ``GET /api/search?q=..&k=..`` back
to back for ``--seconds``, cycling through toyworld-style queries ("a large red circle").
Reported: queries/s, client-side latency p50 / p90 / p99 (round trip: HTTP, JSON, queueing
behind other clients) and the server's own p50 query time (``latency_ms``: encoding the query
and searching the index). Every non-200 answer is counted as an error.

    python benchmarks/bench_serve.py --index runs/demo-clip/index
    python benchmarks/bench_serve.py --run runs/demo-clip/clip_tiny \\
        --shards 'runs/demo-clip/toyworld/image_text/test-*.tar' --out runs/demo-clip/index
    python benchmarks/bench_serve.py --index DIR --clients 0 --screenshot docs/search-page.png

``--run/--shards`` builds the index first (into ``--out``, or a temporary folder).
``--screenshot PATH`` also saves the search page showing ``--query`` (headless Chromium);
``--clients 0`` skips the load test.
"""

from __future__ import annotations

import argparse
import itertools
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIZES = ("small", "large")
COLOURS = ("red", "green", "blue", "yellow", "purple", "orange")
SHAPES = ("circle", "square", "triangle", "star", "diamond")
QUERIES = [f"a {s} {c} {h}" for s, c, h in itertools.product(SIZES, COLOURS, SHAPES)]
FLOATS = ("qps", "p50", "p90", "p99", "server_p50")


def start_server(index: str, device: str) -> tuple[subprocess.Popen, str]:
    """``mmptm serve INDEX --port 0`` in a subprocess; its URL once it listens."""
    cmd = [sys.executable, "-m", "mmptm.cli", "serve", index, "--port", "0", "--device", device]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    # keep reading: an unread pipe would fill with the access log and stall the server
    threading.Thread(target=lambda: [lines.put(s) for s in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        if line.startswith("serving "):
            return proc, line.split(" at ", 1)[1].split(" ", 1)[0]
    proc.kill()
    raise RuntimeError(f"the server did not start: {' '.join(cmd)}")


def load(url: str, clients: int, seconds: float, k: int) -> dict[str, float]:
    """``clients`` threads searching back to back for ``seconds``."""
    latency: list[float] = []
    server_ms: list[float] = []
    errors = [0]
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)
    end = [0.0]

    def client(c: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            http.get("api/health")  # connected before the clock starts
            ready.wait()
            mine, theirs, errs = [], [], 0
            for i in itertools.count(c * 7):
                if time.perf_counter() >= end[0]:
                    break
                t0 = time.perf_counter()
                r = http.get("api/search", params={"q": QUERIES[i % len(QUERIES)], "k": k})
                dt = time.perf_counter() - t0
                if r.status_code == 200:
                    mine.append(dt)
                    theirs.append(r.json()["latency_ms"])
                else:
                    errs += 1
            with lock:
                latency.extend(mine)
                server_ms.extend(theirs)
                errors[0] += errs

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    end[0] = t0 + seconds
    ready.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    ms = 1000 * np.array(latency)
    return {
        "clients": clients,
        "requests": len(latency),
        "qps": len(latency) / elapsed,
        "p50": float(np.percentile(ms, 50)),
        "p90": float(np.percentile(ms, 90)),
        "p99": float(np.percentile(ms, 99)),
        "server_p50": statistics.median(server_ms),
        "errors": errors[0],
    }


def screenshot(url: str, path: str, query: str, lang: str) -> None:
    """The search page showing ``query``'s results, as a PNG."""
    from urllib.parse import urlencode

    from mmptm.search.serve import chromium

    with (
        tempfile.TemporaryDirectory() as profile,
        chromium(profile, viewport={"width": 1280, "height": 820}) as browser,
    ):
        page = browser.new_page()
        page.goto(f"{url}?{urlencode({'q': query, 'lang': lang})}")
        page.wait_for_function(
            "() => document.querySelector('#status').textContent.includes('ms') && "
            "[...document.querySelectorAll('.card img')].every(i => i.naturalWidth > 0)"
        )
        page.screenshot(path=path)
    print(f"screenshot → {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--index", default=None, help="an `mmptm index` directory")
    p.add_argument("--run", default=None, help="build the index from this run ...")
    p.add_argument("--shards", default=None, help="... over these shards")
    p.add_argument("--out", default=None, help="where to build it (default: a temporary dir)")
    p.add_argument("--clients", default="1,4,16", help="comma list of concurrent clients")
    p.add_argument("--seconds", type=float, default=20.0, help="per client count")
    p.add_argument("-k", type=int, default=10, help="results per query")
    p.add_argument("--device", default="cpu")
    p.add_argument("--screenshot", default=None, help="save the search page here (PNG)")
    p.add_argument("--query", default="a large red circle", help="the screenshot's query")
    p.add_argument("--lang", default="en", help="the screenshot's caption language")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        index = args.index
        if index is None:
            if not (args.run and args.shards):
                p.error("give --index DIR, or --run RUN and --shards SPEC to build one")
            from mmptm.search.index import build_index

            index = args.out or f"{tmp}/index"
            print(build_index(args.run, args.shards, index))
        proc, url = start_server(index, args.device)
        try:
            print(f"server: {url} ({index}); {len(QUERIES)} queries, k={args.k}")
            httpx.get(f"{url}api/search", params={"q": QUERIES[0]}, timeout=120)  # warm up
            rows = [load(url, int(n), args.seconds, args.k)
                    for n in args.clients.split(",") if int(n) > 0]  # fmt: skip
            if args.screenshot:
                screenshot(url, args.screenshot, args.query, args.lang)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    if rows:
        print(f"\n{args.seconds:g} s per row, text search, k={args.k}\n")
        print("| clients | requests | queries/s | p50 ms | p90 ms | p99 ms | server p50 ms | "
              "errors |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
        for r in rows:
            cells = [r["clients"], r["requests"], *(f"{r[c]:.1f}" for c in FLOATS), r["errors"]]
            print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
