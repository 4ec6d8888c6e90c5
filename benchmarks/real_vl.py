"""The image–text recipes on real pictures with human-written names: emoji ↔ their CLDR names,
retrieval beside baselines that learn nothing and an equal-shape open_clip model (issue 37).

    python benchmarks/real_vl.py prepare   --data data/real_vl
    python benchmarks/real_vl.py baselines --data data/real_vl [--split test]
    python benchmarks/real_vl.py pretrain  --data data/real_vl --runs runs/real_vl \\
        [--recipes clip_tiny,albef_tiny] [--steps N] [--set k=v ...]
    python benchmarks/real_vl.py eval      --data data/real_vl --runs runs/real_vl [--split test]
    python benchmarks/real_vl.py peer      --data data/real_vl --runs runs/real_vl [--steps N]

``prepare`` builds the data from two Debian packages (``real_vl_data.py``: Noto Color Emoji
pictures, CLDR 41 names and keywords in en, de, fr, es, ru, ja), splits it by emoji (train
/ val / test share no picture and no name), writes Karpathy's dataset JSON and the shards with
``mmptm data karpathy`` (``en/``: one sample a picture, its two English captions), the
same samples with the captions of every language (``multi/``), and BPE tokenizers with
``mmptm tokenizer train``. ``baselines``: colour histograms and random-weight CNN features
mapped onto bag-of-words caption vectors by ridge regression fitted on train (the ridge
weight picked on val). ``pretrain`` runs ``mmptm pretrain`` per recipe on the ``en`` shards;
``eval`` runs ``mmptm eval retrieval`` on every run; ``peer`` trains open_clip's ``CLIP``
at clip_tiny's shape on the same batches (mmptm's loader) for the same steps and scores it
the same way. Queries: each picture's English name (caption 0); chance R@k = k / N.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_vl_data import (  # noqa: E402
    LICENCES,
    Renderer,
    collect_items,
    karpathy_json,
    missing_packages,
    multilingual_records,
    split_items,
    write_manifest,
)

from mmptm.data.shards import ShardWriter  # noqa: E402
from mmptm.eval.retrieval import recall_at_k  # noqa: E402

LANGS = ("en", "de", "fr", "es", "ru", "ja")
RECIPES = ("clip_tiny",)
MMPTM = [sys.executable, "-m", "mmptm.cli"]
KS = (1, 5, 10)


def sh(cmd: list[str], log: Path | None = None) -> None:
    """Run an mmptm command (printed first, as a user would type it)."""
    print("$ mmptm " + " ".join(cmd[len(MMPTM) :] if cmd[: len(MMPTM)] == MMPTM else cmd))
    out = open(log, "a") if log else None  # noqa: SIM115 (closed below)
    try:
        subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT if out else None)
    finally:
        if out:
            out.close()


# -- prepare ------------------------------------------------------------------------------


def read_shards(pattern: str) -> list[dict]:
    """Samples of the shards matching ``pattern`` in file order: ``{"key", "jpg", "json"}``."""
    paths = sorted(Path(pattern).parent.glob(Path(pattern).name))
    if not paths:
        raise SystemExit(f"no shards match {pattern}: run `prepare` first")
    samples: dict[str, dict] = {}
    for path in paths:
        with tarfile.open(path) as tar:
            for m in tar.getmembers():
                key, _, ext = m.name.partition(".")
                data = tar.extractfile(m).read()
                samples.setdefault(key, {"key": key})[ext] = (
                    json.loads(data) if ext == "json" else data
                )
    return list(samples.values())


def write_multilingual(data: Path, records: list[dict]) -> dict[str, int]:
    """``multi/{split}-*.tar``: the ``en`` shards' samples with every language's captions."""
    by_key = {r["key"]: r for r in records}
    counts = {}
    for split in ("train", "val", "test"):
        samples = read_shards(f"{data}/en/{split}-*.tar")
        with ShardWriter(data / "multi" / f"{split}-%06d.tar", 500) as writer:
            for s in samples:
                meta = dict(s["json"], captions=by_key[s["key"]]["captions"])
                writer.write({"__key__": s["key"], "jpg": s["jpg"], "txt": s["txt"], "json": meta})
        counts[split] = len(samples)
    return counts


def prepare(args: argparse.Namespace) -> None:
    missing = missing_packages()
    if missing:
        raise SystemExit(f"missing Debian packages: apt-get install {' '.join(missing)}")
    data = Path(args.data)
    work = data / "work"
    t0 = time.perf_counter()
    items = collect_items(LANGS, skin_tones=args.skin_tones)
    parts, moved = split_items(items, args.val_fraction, args.test_fraction, args.seed)
    dataset, not_drawn = karpathy_json(parts, Renderer(size=args.size), work / "images", "en")
    (work / "dataset_emoji.json").write_text(json.dumps(dataset, ensure_ascii=False))
    sh([*MMPTM, "data", "karpathy", "--input", str(work / "dataset_emoji.json"), "--images",
        str(work / "images"), "--out", str(data / "en"), "--shard-size", "500",
        "--no-progress"])  # fmt: skip
    counts = write_multilingual(data, multilingual_records(dataset, items))
    sh([*MMPTM, "tokenizer", "train", "--input", f"{data}/en/train-*.tar", "--out",
        str(data / "tokenizer"), "--vocab-size", str(args.vocab), "--model-type", "bpe"])  # fmt: skip
    sh([*MMPTM, "tokenizer", "train", "--input", f"{data}/multi/train-*.tar", "--out",
        str(data / "tokenizer_multi"), "--vocab-size", str(args.vocab_multi),
        "--model-type", "bpe"])  # fmt: skip
    info = {
        "sources": LICENCES,
        "languages": list(LANGS),
        "named_emoji": len(items),
        "not_drawn": not_drawn,
        "moved_to_train_for_a_shared_name": moved,
        "pictures": counts,
        "picture_px": args.size,
        "skin_tones": args.skin_tones,
        "seed": args.seed,
    }
    write_manifest(data / "manifest.json", info)
    print(json.dumps(info, ensure_ascii=False))
    print(f"prepared {data} in {time.perf_counter() - t0:.0f}s")


def baselines(args): ...
def pretrain(args): ...
def evaluate(args): ...
def peer(args): ...


# -- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    torch.set_num_threads(1)  # the development machine's 2 cores are shared
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    cmds = {}
    for name, fn in (("prepare", prepare), ("baselines", baselines), ("pretrain", pretrain),
                     ("eval", evaluate), ("peer", peer)):  # fmt: skip
        q = sub.add_parser(name)
        q.add_argument("--data", default="data/real_vl")
        q.add_argument("--runs", default="runs/real_vl")
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--split", default="test", choices=["val", "test"])
        cmds[name] = fn
    q = sub.choices["prepare"]
    q.add_argument("--val-fraction", type=float, default=0.1)
    q.add_argument("--test-fraction", type=float, default=0.2)
    q.add_argument("--size", type=int, default=96, help="picture side in pixels")
    q.add_argument("--vocab", type=int, default=1000)
    q.add_argument("--vocab-multi", type=int, default=4000)
    q.add_argument("--skin-tones", action="store_true", help="add the skin-tone variants")
    for name in ("pretrain", "peer"):
        q = sub.choices[name]
        q.add_argument("--recipes", default=",".join(RECIPES))
        q.add_argument("--steps", type=int, default=0, help="train.max_steps (0: the recipe's)")
        q.add_argument("--tag", default="", help="suffix of the run folder")
        q.add_argument("--set", nargs="*", default=[], help="more key=value overrides")
    sub.choices["eval"].add_argument("--only", default="", help="comma list of run folders")
    args = p.parse_args(argv)
    cmds[args.command](args)


if __name__ == "__main__":
    main()
