"""An index end to end: each item's own caption as the query, per language, and the latency
of text, image and item queries (model encoding + search, as ``mmptm retrieve`` and the
web page measure it).

For every item and every language of the index, its caption in that language is the query
(``search_text(caption, k=10, lang=L)``): R@1 / R@10 = how often the item itself comes
first / in the top 10 (text → item; for English this is what ``mmptm eval retrieval``
reports as t2i R@k on the same items). Then ``--queries`` text queries (captions), image
queries (the items' own pictures, searching the captions) and "more like this" queries are
timed one by one: p50 / p99 milliseconds.

    .venv/bin/python benchmarks/bench_search.py INDEX [--queries 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from mmptm.data.shards import read_sample
from mmptm.search.index import SearchIndex


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("index")
    p.add_argument("--queries", type=int, default=200, help="timed queries of each kind")
    p.add_argument("--threads", type=int, default=1, help="torch and FAISS threads")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.threads)
    t = time.perf_counter()
    index = SearchIndex.open(args.index)
    print(f"# {args.index}: {index.info['items']} items, {index.info['counts']}, opened in "
          f"{time.perf_counter() - t:.1f} s; {args.threads} thread(s)")  # fmt: skip
    print("\n| language | captions | R@1 | R@10 |\n|---|---|---|---|")
    for lang in index.info["languages"]:
        ranks = []
        for key in index.keys:
            caption = index.item(key)["texts"].get(lang, [None])[0]
            if caption is None:
                continue
            found = [h.key for h in index.search_text(caption, k=10, lang=lang)]
            ranks.append(found.index(key) if key in found else 10)
        r = np.array(ranks)
        print(f"| {lang} | {len(r)} | {100 * (r < 1).mean():.1f}% | {100 * (r < 10).mean():.1f}% |")
    keys = index.keys[: args.queries]
    lang = index.default_lang
    pictures = [_picture(index, k) for k in keys]
    kinds = {
        "text → items": lambda i: index.search_text(index.item(keys[i])["texts"][lang][0], k=10),
        "image → captions": lambda i: index.search_image(pictures[i], k=10),
        "more like this": lambda i: index.search_key(keys[i], k=10),
    }
    print("\n| query | p50 ms | p99 ms |\n|---|---|---|")
    for name, ask in kinds.items():
        if name == "image → captions" and pictures[0] is None:
            continue
        ask(0)  # warm-up
        ms = []
        for i in range(len(keys)):
            t = time.perf_counter()
            ask(i)
            ms.append(1000 * (time.perf_counter() - t))
        print(f"| {name} | {np.percentile(ms, 50):.2f} | {np.percentile(ms, 99):.2f} |")


def _picture(index: SearchIndex, key: str) -> bytes | None:
    """The item's original image member, read back from its shard (None without one)."""
    sample = read_sample(index.items[index.number[key]]["shard"], key)
    return next((sample[e] for e in ("jpg", "jpeg", "png", "webp") if e in sample), None)


if __name__ == "__main__":
    main()
