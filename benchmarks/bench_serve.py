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

Uploads (``--uploaders 2,4,8``, the default; ``--uploaders 0`` skips them): one client
searches text back to back, first alone, then while N clients each upload a large image
(``--upload-size``, a 6000×6000 PNG of a few shapes: ~100 kB on the wire, 36 Mpixels
decoded) in a loop, waiting what ``Retry-After`` asks when the server answers 503. Reported
per row: the text search's p50 / p95 / p99 and their ratio to the row alone, uploads
answered (200) and refused (503) per second, and the server's peak RSS (its process and
children, from /proc); then its RSS when idle before the uploads, 1 s after them and
``--settle`` seconds later.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
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
#: the text-search percentiles of the upload rows
PERCENTILES = (50, 95, 99)


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


def big_png(side: int) -> bytes:
    """A ``side``×``side`` PNG of a few flat shapes: small on the wire, large decoded."""
    import io

    from PIL import Image, ImageDraw

    img = Image.new("RGB", (side, side), (235, 230, 220))
    draw = ImageDraw.Draw(img)
    s = side // 10
    draw.ellipse((1 * s, 1 * s, 4 * s, 4 * s), fill=(220, 30, 30))
    draw.rectangle((5 * s, 2 * s, 9 * s, 5 * s), fill=(30, 30, 220))
    draw.polygon([(2 * s, 9 * s), (5 * s, 5 * s), (8 * s, 9 * s)], fill=(30, 200, 30))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` and its descendants, in MB (Linux /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(
                next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS"))
            )
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration):  # gone meanwhile, or a kernel thread
            continue
    return total / 1024


def uploading(url: str, png: bytes, clients: int, stop, counts) -> None:
    """``clients`` threads uploading ``png`` until ``stop`` is set, counting the answers
    (200, 503, other) in ``counts``. Runs in a process of its own, so that the uploaders'
    work does not hold up the text client's thread (one GIL) and skew what it measures."""

    def upload() -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            while not stop.is_set():
                r = http.post("api/search/image", files={"file": ("big.png", png)})
                with counts.get_lock():
                    counts[{200: 0, 503: 1}.get(r.status_code, 2)] += 1
                if r.status_code == 503:
                    stop.wait(float(r.headers.get("retry-after", 1)))

    threads = [threading.Thread(target=upload) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def with_uploads(url: str, pid: int, uploaders: int, seconds: float, png: bytes) -> dict:
    """One client searching text back to back for ``seconds`` while ``uploaders`` clients
    (another process) upload ``png`` in a loop, honouring 503's Retry-After; the text
    search's round trips and the server's own times, and its peak RSS meanwhile."""
    ctx = multiprocessing.get_context("spawn")
    stop, counts = ctx.Event(), ctx.Array("i", 3)
    peak = [rss_mb(pid)]
    watching = threading.Event()

    def watch() -> None:
        while not watching.wait(0.1):
            peak[0] = max(peak[0], rss_mb(pid))

    threads = [threading.Thread(target=watch)]
    if uploaders:
        threads.append(ctx.Process(target=uploading, args=(url, png, uploaders, stop, counts)))
    for t in threads:
        t.start()
    try:
        if uploaders:
            time.sleep(min(3.0, seconds / 4))  # the uploads under way before the clock starts
        times, server_ms, errors = [], [], 0
        with httpx.Client(base_url=url, timeout=120) as http:
            t0 = time.perf_counter()
            for i in itertools.count():
                if time.perf_counter() - t0 >= seconds:
                    break
                q0 = time.perf_counter()
                r = http.get("api/search", params={"q": QUERIES[i % len(QUERIES)], "k": 10})
                if r.status_code == 200:
                    times.append(1000 * (time.perf_counter() - q0))
                    server_ms.append(r.json()["latency_ms"])
                else:
                    errors += 1
            elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        watching.set()
        for t in threads:
            t.join()
    row = {"uploaders": uploaders, "queries": len(times), "qps": len(times) / elapsed}
    row.update({f"p{q}": float(np.percentile(times, q)) for q in PERCENTILES})
    row.update(server_p99=float(np.percentile(server_ms, 99)), uploads_s=counts[0] / elapsed,
               busy_s=counts[1] / elapsed, errors=errors + counts[2], peak_mb=peak[0])  # fmt: skip
    return row


def upload_rows(url: str, pid: int, uploaders: list[int], seconds: float, size: int,
                settle: float) -> tuple[list[dict], dict]:  # fmt: skip
    """Text search alone, then with each number of uploaders; RSS idle and afterwards."""
    png = big_png(size)
    print(f"upload: a {size}×{size} PNG of {len(png) / 1000:.0f} kB")
    idle_mb = rss_mb(pid)
    rows = [with_uploads(url, pid, n, seconds, png) for n in [0, *uploaders]]
    time.sleep(1)
    memory = {"idle_mb": idle_mb, "after_1_mb": rss_mb(pid), "png_kb": len(png) / 1000}
    time.sleep(settle)
    memory.update(after_mb=rss_mb(pid), settle=1 + settle)
    return rows, memory


def print_upload_rows(rows: list[dict], memory: dict, seconds: float, size: int) -> None:
    alone = rows[0]
    print(f"\n{seconds:g} s per row: 1 client searching text (k=10) while N clients upload a "
          f"{size}×{size} PNG ({memory['png_kb']:.0f} kB)\n")  # fmt: skip
    head = ["uploaders", "text queries/s", "p50 ms", "p95 ms", "p99 ms", "p95 / alone",
            "p99 / alone", "server p99 ms", "uploads/s (200)", "503/s", "errors",
            "peak RSS MB"]  # fmt: skip
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        cells = [r["uploaders"], f"{r['qps']:.1f}", *(f"{r[f'p{q}']:.1f}" for q in PERCENTILES),
                 *(f"{r[p] / alone[p]:.1f}×" for p in ("p95", "p99")), f"{r['server_p99']:.1f}",
                 f"{r['uploads_s']:.2f}", f"{r['busy_s']:.2f}", r["errors"],
                 f"{r['peak_mb']:.0f}"]  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |")
    print(f"\nserver RSS: {memory['idle_mb']:.0f} MB idle before the uploads, "
          f"{memory['after_1_mb']:.0f} MB 1 s after them, {memory['after_mb']:.0f} MB "
          f"{memory['settle']:g} s after them")  # fmt: skip


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
    p.add_argument("--uploaders", default="2,4,8",
                   help="comma list of clients uploading a large image (0: none)")  # fmt: skip
    p.add_argument("--upload-size", type=int, default=6000, help="side of the uploaded PNG")
    p.add_argument("--upload-seconds", type=float, default=20.0, help="per upload row")
    p.add_argument("--settle", type=float, default=40.0,
                   help="seconds after the uploads before the RSS is read again (the "
                   "server stops its idle decoders after 30 s)")  # fmt: skip
    args = p.parse_args()
    uploaders = [int(n) for n in args.uploaders.split(",") if int(n) > 0]

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
            if uploaders:
                up, memory = upload_rows(url, proc.pid, uploaders, args.upload_seconds,
                                         args.upload_size, args.settle)  # fmt: skip
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
    if uploaders:
        print_upload_rows(up, memory, args.upload_seconds, args.upload_size)


if __name__ == "__main__":
    main()
