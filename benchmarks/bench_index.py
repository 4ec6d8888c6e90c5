"""Search indexes on random vectors: build time, query latency and recall@10 of the
approximate indexes (IVF, HNSW) against exact search.

N random 256-d unit vectors (Gaussian, normalised) are indexed the way ``mmptm index``
does it (``mmptm/search/store.py: new_index``, inner product), and Q other random unit
vectors are the queries. Exact search (``flat``) gives the true top 10 of each query; each
approximate setting is scored by recall@10 = the share of those it returns in its own top
10. Latency: single queries one by one (p50 / p99 over ``--latency-queries``), and batches
of 64 (p50 / p99 per batch over all Q queries), on ``--query-threads`` threads (default 1:
a server answers each query on one thread); building uses every core.

Random vectors are the worst case for approximate search: they have no cluster structure
for IVF's cells and no low intrinsic dimension for HNSW's graph to follow, and every
vector's ten nearest neighbours are barely nearer than the rest. Embeddings of real
collections are far easier; read these recalls as a lower bound at each setting.
``--clusters C`` draws the vectors and queries around C random centres instead (noise of
norm 0.5 around each), a structure closer to real embeddings.

    .venv/bin/python benchmarks/bench_index.py                        # N = 1 M (see RESULTS.md)
    .venv/bin/python benchmarks/bench_index.py --n 100000 --nlist 1024 --types flat,ivf
"""

from __future__ import annotations

import argparse
import time

import faiss
import numpy as np

from mmptm.search.store import IndexOptions, new_index, prepare


def unit_vectors(
    n: int, dim: int, seed: int, centres: np.ndarray | None = None, spread: float = 0.5
) -> np.ndarray:
    """``n`` random unit vectors, float32 [n, dim], generated in chunks (memory): uniform
    on the sphere, or around random ``centres`` (noise of norm about ``spread``)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    for s in range(0, n, 100_000):
        x = rng.standard_normal((min(100_000, n - s), dim), dtype=np.float32)
        if centres is not None:
            x = centres[rng.integers(len(centres), size=len(x))] + spread / dim**0.5 * x
        out[s : s + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def latencies(index: faiss.Index, q_QE: np.ndarray, k: int, single: int) -> dict[str, float]:
    """p50 / p99 milliseconds of single queries and of batches of 64, and the top k of all."""
    one = []
    for i in range(min(single, len(q_QE))):
        t = time.perf_counter()
        index.search(q_QE[i : i + 1], k)
        one.append(time.perf_counter() - t)
    batch, ids = [], []
    for s in range(0, len(q_QE), 64):
        t = time.perf_counter()
        _, ids_BK = index.search(q_QE[s : s + 64], k)
        batch.append(time.perf_counter() - t)
        ids.append(ids_BK)
    ms = lambda xs, p: 1000 * float(np.percentile(xs, p))  # noqa: E731
    return {
        "p50": ms(one, 50), "p99": ms(one, 99), "b64_p50": ms(batch, 50),
        "b64_p99": ms(batch, 99), "ids": np.concatenate(ids),
    }  # fmt: skip


def recall_at(ids_QK: np.ndarray, truth_QK: np.ndarray) -> float:
    hits = [len(set(a) & set(b)) for a, b in zip(ids_QK.tolist(), truth_QK.tolist())]
    return sum(hits) / truth_QK.size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000, help="indexed vectors")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--queries", type=int, default=1000, help="for recall and batch latency")
    p.add_argument("--latency-queries", type=int, default=200, help="timed one at a time")
    p.add_argument("--clusters", type=int, default=0,
                   help="0: uniform random vectors; C: vectors (and queries) around C random "
                   "centres, a structure closer to real embeddings")  # fmt: skip
    p.add_argument("--types", default="flat,ivf,hnsw")
    p.add_argument("--nlist", type=int, default=4096)
    p.add_argument("--nprobe", default="1,8,32,128")
    p.add_argument("--train-size", type=int, default=0, help="ivf k-means sample (0: mmptm's)")
    p.add_argument("--m", type=int, default=32)
    p.add_argument("--ef-construction", type=int, default=40)
    p.add_argument("--ef", default="16,64,256")
    p.add_argument("--threads", type=int, default=0, help="building: OpenMP threads (0: all)")
    p.add_argument("--query-threads", type=int, default=1,
                   help="searching (a server answers each query on one thread)")  # fmt: skip
    args = p.parse_args()
    build_threads = args.threads or faiss.omp_get_max_threads()
    k = 10
    t = time.perf_counter()
    centres = unit_vectors(args.clusters, args.dim, seed=2) if args.clusters else None
    x_NE = unit_vectors(args.n, args.dim, seed=0, centres=centres)
    q_QE = unit_vectors(args.queries, args.dim, seed=1, centres=centres)
    shape = f"around {args.clusters} centres" if args.clusters else "uniform"
    print(f"# {args.n} × {args.dim} vectors ({shape}), {args.queries} queries, k={k}, threads: "
          f"{build_threads} building, {args.query_threads} searching; data in "
          f"{time.perf_counter() - t:.1f} s")  # fmt: skip
    rows = []
    types = args.types.split(",")
    settings = {
        "flat": [("", None)],
        "ivf": [(f"nprobe={v}", int(v)) for v in args.nprobe.split(",")],
        "hnsw": [(f"ef={v}", int(v)) for v in args.ef.split(",")],
    }
    truth = None
    for kind in ["flat", *[t for t in types if t != "flat"]]:  # exact first: the truth
        opts = IndexOptions(
            type=kind, nlist=args.nlist, m=args.m, ef_construction=args.ef_construction,
            train_size=args.train_size,
        )  # fmt: skip
        faiss.omp_set_num_threads(build_threads)
        t = time.perf_counter()
        index, info = new_index(opts, x_NE)
        build = time.perf_counter() - t
        faiss.omp_set_num_threads(args.query_threads)
        label = {"flat": "flat (exact)", "ivf": f"IVF nlist={info.get('nlist')}",
                 "hnsw": f"HNSW M={args.m} efC={args.ef_construction}"}[kind]  # fmt: skip
        extra = f", k-means on {info['trained_on']}" if kind == "ivf" else ""
        print(f"# {label}: built in {build:.1f} s{extra}", flush=True)
        for name, value in settings[kind]:
            prepare(index, value or 1, value or 1)
            r = latencies(index, q_QE, k, args.latency_queries)
            if truth is None:
                truth = r["ids"]
            recall = recall_at(r["ids"], truth)
            if kind in types:
                rows.append((label, name, build, r, recall))
                print(f"#   {name or '-'}: recall@10 {recall:.3f}, single p50 {r['p50']:.2f} ms",
                      flush=True)  # fmt: skip
        del index
    print("\n| index | query setting | build s | single p50 ms | single p99 ms "
          "| batch-64 p50 ms | batch-64 p99 ms | recall@10 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for label, name, build, r, recall in rows:
        print(f"| {label} | {name or '-'} | {build:.1f} | {r['p50']:.2f} | {r['p99']:.2f} "
              f"| {r['b64_p50']:.1f} | {r['b64_p99']:.1f} | {recall:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
