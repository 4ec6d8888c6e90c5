"""``mmptm data manifest SPEC``: count the samples (and languages) of shards that have no
manifest, and write it beside them (:mod:`mmptm.data.manifest`).

Converters write the manifest as they write the shards when given ``--manifest``; this is
for shards written without it, or from elsewhere (img2dataset, a bucket someone filled).
Remote shards are read through the same reader as training (``http(s)://``, ``pipe:``,
``s3://``...); their manifest goes to ``--out``, to be copied beside them.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from mmptm.data.manifest import (
    MANIFEST,
    ShardInfo,
    manifest_json,
    manifest_url,
    sample_language,
    shard_name,
    write_manifest,
)
from mmptm.data.remote import RemoteOptions, is_remote
from mmptm.data.shards import SkipCounter, expand_shards, read_shard
from mmptm.progress import progress_bar
from mmptm.registry import CONVERTERS


def scan_shard(url: str, handler: SkipCounter, remote: RemoteOptions | None = None) -> ShardInfo:
    """One shard's manifest entry, from reading it whole: its samples as training reads them
    (bad input skipped and counted by ``handler``), their languages, its size if local."""
    languages: Counter[str] = Counter()
    n = 0
    for sample in read_shard(url, handler, remote):
        n += 1
        if (lang := sample_language(sample.get("json"))) is not None:
            languages[lang] += 1
    size = None if is_remote(url) else os.path.getsize(url)
    return ShardInfo(n, size, dict(sorted(languages.items())))


def write_manifests(
    spec: str,
    out: str | None = None,
    remote: RemoteOptions | None = None,
    progress: bool = True,
    handler: SkipCounter | None = None,
) -> dict[str, dict[str, ShardInfo]]:
    """Scan the shards of ``spec`` and write their manifest: beside local shards (added to
    the one there), or to ``out`` (needed for remote shards, which are not written to).
    Bad input is skipped and counted by ``handler``. Returns manifest path → its entries."""
    urls = expand_shards(spec)
    groups: dict[str, dict[str, str]] = {}
    for url in urls:
        groups.setdefault(manifest_url(url), {})[shard_name(url)] = url
    if out is None:
        far = next((where for where in groups if is_remote(where)), None)
        if far is not None:
            raise ValueError(
                f"cannot write {far}: give --out FILE for remote shards, then copy FILE "
                "beside them (its name there: shardindex.json)"
            )
    elif len(groups) > 1:
        raise ValueError(
            f"{spec!r} names shards in {len(groups)} folders: one --out manifest lists one "
            "folder's shards (write one per folder)"
        )
    handler = handler or SkipCounter()
    bar = progress_bar(total=len(urls), desc="count", unit="shard", enabled=progress)
    written: dict[str, dict[str, ShardInfo]] = {}
    for where, shards in groups.items():
        infos = {}
        for name, url in shards.items():
            infos[name] = scan_shard(url, handler, remote)
            bar.update(1)
        if out is None:
            write_manifest(where, infos)
            written[where] = infos
        else:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_bytes(manifest_json(infos))
            written[out] = infos
    bar.close()
    return written


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "spec",
        help="shards: a glob, brace pattern, directory, http(s):// or s3:// URL pattern, or "
        "pipe:COMMAND (quote it)",
    )
    p.add_argument(
        "--out",
        default=None,
        help=f"write the manifest here (default: {MANIFEST} beside local shards; required "
        "for remote ones)",
    )
    p.add_argument("--retries", type=int, default=RemoteOptions.retries)
    p.add_argument("--timeout-s", type=float, default=RemoteOptions.timeout_s)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


@CONVERTERS.register(
    "manifest", "count shards' samples and languages into their manifest", _arguments
)
def _manifest_command(args: argparse.Namespace) -> int:
    remote = RemoteOptions(retries=args.retries, timeout_s=args.timeout_s)
    handler = SkipCounter()
    written = write_manifests(args.spec, args.out, remote, not args.no_progress, handler)
    summary: dict[str, Any] = {
        where: {
            "shards": len(infos),
            "samples": sum(i.nsamples for i in infos.values()),
            "languages": dict(sorted(sum((Counter(i.languages) for i in infos.values()),
                                         Counter()).items())),
        }
        for where, infos in written.items()
    }  # fmt: skip
    summary["skipped"] = handler.count
    print(json.dumps(summary, ensure_ascii=False))
    return 0
