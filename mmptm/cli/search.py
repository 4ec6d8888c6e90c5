"""``mmptm index``, ``mmptm retrieve`` and ``mmptm serve``: a FAISS index of a collection,
queried from the command line or served as a search page and JSON API."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mmptm.cli.flags import device
from mmptm.registry import default_of

#: help of --verify (retrieve, serve)
VERIFY = (
    "check every index file's SHA-256 against index.json before answering (reads them all; "
    "their sizes are always checked)"
)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm index``, ``mmptm retrieve`` and ``mmptm serve``."""
    sub.add_parser("index", help="embed a collection with a dual encoder into a FAISS index",
                   fill=_index_arguments)  # fmt: skip
    sub.add_parser("retrieve", help="query an index: text, an image file, or an item key",
                   fill=_retrieve_arguments)  # fmt: skip
    sub.add_parser("serve", help="the search page and JSON API over an `mmptm index` dir",
                   fill=_serve_arguments)  # fmt: skip


def _index_arguments(ix: argparse.ArgumentParser) -> None:
    from mmptm.search.index import build_index as fn
    from mmptm.search.store import INDEX_TYPES, TRAIN_PER_CELL, IndexOptions

    o = IndexOptions()
    ix.add_argument("run", help="run directory or checkpoint file (CLIP, ALBEF, text↔text ...)")
    ix.add_argument("overrides", nargs="*", help="key=value overrides of the saved config")
    ix.add_argument("--shards", required=True, help="shard spec (glob, brace, dir, commas)")
    ix.add_argument("--out", required=True, help="index directory (new, or with --add)")
    ix.add_argument(
        "--add",
        action="store_true",
        help="append to the index at --out (same run; known keys are skipped)",
    )
    # the index options left out are IndexOptions' defaults
    ix.add_argument("--index-type", dest="type", choices=INDEX_TYPES, default=None,
                    help="flat: exact (default); ivf / hnsw: approximate, for large "
                    "collections")  # fmt: skip
    ix.add_argument("--nlist", type=int, default=None, help="ivf cells (default 4·√N)")
    ix.add_argument("--m", type=int, default=None, help=f"hnsw links per node (default {o.m})")
    ix.add_argument("--ef-construction", type=int, default=None,
                    help=f"hnsw (default {o.ef_construction})")  # fmt: skip
    ix.add_argument(
        "--nprobe",
        type=int,
        default=None,
        help=f"ivf cells visited per query, stored as the default ({o.nprobe})",
    )
    ix.add_argument("--ef", type=int, default=None,
                    help=f"hnsw candidates per query, stored as the default ({o.ef})")  # fmt: skip
    ix.add_argument("--train-size", type=int, default=None,
                    help=f"ivf: k-means on at most this many vectors (default "
                    f"{TRAIN_PER_CELL}·nlist)")  # fmt: skip
    ix.add_argument("--batch-size", type=int, default=default_of(fn, "batch_size"))
    ix.add_argument("--workers", type=int, default=default_of(fn, "workers"),
                    help="loader worker processes (decoding)")  # fmt: skip
    ix.add_argument("--device", type=device, default=default_of(fn, "device"))
    ix.add_argument("--thumbnail-size", type=int, default=default_of(fn, "thumbnail_size"),
                    help="longest side, pixels")  # fmt: skip
    ix.add_argument("--strict", action="store_true",
                    help="fail on a damaged shard or a sample that cannot be read, instead "
                    "of skipping and counting it")  # fmt: skip
    ix.set_defaults(fn=_index)


def _index(args: argparse.Namespace) -> int:
    from mmptm.search.index import build_index
    from mmptm.search.store import IndexOptions

    fields = ("type", "nlist", "m", "ef_construction", "nprobe", "ef", "train_size")
    given = {f: getattr(args, f) for f in fields if getattr(args, f) is not None}
    summary = build_index(
        args.run, args.shards, args.out, add=args.add,
        options=IndexOptions(**given) if given else None, batch_size=args.batch_size,
        workers=args.workers, device=args.device, thumbnail_size=args.thumbnail_size,
        overrides=args.overrides, strict=args.strict,
    )  # fmt: skip
    damaged = f"; damaged shards: {len(summary['damaged'])}" if summary["damaged"] else ""
    print(f"{summary['added']} items → {args.out} ({summary['items']} in all; skipped: "
          f"{summary['skipped']}{damaged}) in {summary['seconds']} s")  # fmt: skip
    print(json.dumps(summary, ensure_ascii=False))
    return 0


def _retrieve_arguments(rt: argparse.ArgumentParser) -> None:
    from mmptm.search.index import SearchIndex

    k = default_of(SearchIndex.search_text, "k")
    rt.add_argument("index", help="index directory (`mmptm index`)")
    rt.add_argument("query", nargs="?", default=None, help="text query (any language)")
    rt.add_argument("--image", default=None, help="image file as the query")
    rt.add_argument("--key", default=None, help="more like this item")
    rt.add_argument("-k", type=int, default=k, help=f"hits (default {k})")
    rt.add_argument("--lang", default=None,
                    help="captions shown in this language; on a text side, the language "
                    "searched (default: all)")  # fmt: skip
    rt.add_argument("--query-lang", default=None, help="the query's language (default --lang)")
    rt.add_argument(
        "--side", default=None, help="the side searched (default: items for text, text for images)"
    )
    rt.add_argument("--rerank-k", type=int, default=default_of(SearchIndex.search_text, "rerank_k"),
                    help="re-rank the top K with the model's ITM head (ALBEF)")  # fmt: skip
    rt.add_argument("--nprobe", type=int, default=None, help="ivf: cells visited per query")
    rt.add_argument("--ef", type=int, default=None, help="hnsw: candidates per query")
    rt.add_argument(
        "--run",
        default=None,
        help="the run to load (default: the checkpoint the index was built with)",
    )
    rt.add_argument("--device", type=device, default=default_of(SearchIndex.open, "device"))
    rt.add_argument("--verify", action="store_true", help=VERIFY)
    rt.add_argument("--json", action="store_true", help="print the hits as JSON")
    rt.set_defaults(fn=_retrieve)


def _retrieve(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from mmptm.search.index import SearchIndex, format_hits

    asked = [n for n, v in (("QUERY", args.query), ("--image", args.image), ("--key", args.key))
             if v is not None]  # fmt: skip
    if len(asked) != 1:
        raise ValueError(f"give one of QUERY, --image FILE, --key KEY (got {asked or 'none'})")
    if asked[0] != "QUERY" and (args.rerank_k or args.query_lang):
        raise ValueError(f"--rerank-k and --query-lang go with a text QUERY, not {asked[0]}")
    image = Path(args.image).read_bytes() if args.image else None
    index = SearchIndex.open(args.index, device=args.device, run=args.run, verify=args.verify)
    if args.nprobe is not None or args.ef is not None:
        index.set_search(nprobe=args.nprobe, ef=args.ef)
    common = dict(k=args.k, side=args.side, lang=args.lang)
    t0 = time.perf_counter()
    try:
        if image is not None:
            hits = index.search_image(image, **common)
        elif args.key is not None:
            hits = index.search_key(args.key, **common)
        else:
            hits = index.search_text(
                args.query, rerank_k=args.rerank_k, query_lang=args.query_lang, **common
            )
    except KeyError as e:  # an unknown item key
        raise ValueError(e.args[0]) from None
    ms = 1000 * (time.perf_counter() - t0)
    if args.json:
        query = {"text": args.query, "image": args.image, "key": args.key}
        out = {"query": query, "ms": round(ms, 2), "hits": [asdict(h) for h in hits]}
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(format_hits(hits))
        print(f"{len(hits)} hits in {ms:.1f} ms")
    return 0


def _serve_arguments(sv: argparse.ArgumentParser) -> None:
    from mmptm.search.serve import create_app
    from mmptm.search.serve import serve as fn

    sv.add_argument("index", help="directory written by `mmptm index`")
    sv.add_argument("--host", default=default_of(fn, "host"),
                    help="address to listen on (0.0.0.0: all)")  # fmt: skip
    sv.add_argument("--port", type=int, default=default_of(fn, "port"), help="0: any free port")
    sv.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                    help="a name this server is reached by besides localhost and --host "
                    "(requests naming another Host get 400: DNS rebinding); repeat for more, "
                    "'*' for any")  # fmt: skip
    sv.add_argument("--max-image-pixels", type=int,
                    default=default_of(create_app, "max_image_pixels"),
                    help="uploaded images decoding to more pixels get 413")  # fmt: skip
    sv.add_argument("--decode-workers", type=int, default=default_of(create_app, "decode_workers"),
                    help="threads decoding uploaded images")  # fmt: skip
    sv.add_argument("--decode-queue", type=int, default=default_of(create_app, "decode_queue"),
                    help="uploads waiting for a decoder (then 503, Retry-After)")  # fmt: skip
    sv.add_argument("--device", type=device, default=default_of(fn, "device"),
                    help="where the model encodes queries")  # fmt: skip
    sv.add_argument("--run", default=None, help="model run instead of the one in index.json")
    sv.add_argument("--captioner", default=None, metavar="RUN",
                    help="a run that writes captions for the page's Describe (default: the "
                    "index's run, if it writes)")  # fmt: skip
    sv.add_argument("--verify", action="store_true", help=VERIFY)
    sv.set_defaults(fn=_serve)


def _serve(args: argparse.Namespace) -> int:
    from mmptm.search.serve import serve

    def ready(url: str) -> None:
        print(f"serving {args.index} at {url} (the search page; the API is under {url}api/, "
              f"its schema at {url}openapi.json); Ctrl+C stops", flush=True)  # fmt: skip

    serve(args.index, host=args.host, port=args.port, device=args.device, run=args.run,
          captioner=args.captioner,
          log_level="debug" if args.verbose else "info", on_ready=ready,
          verify=args.verify, allow_hosts=args.allow_host,
          max_image_pixels=args.max_image_pixels, decode_workers=args.decode_workers,
          decode_queue=args.decode_queue)  # fmt: skip
    return 0
