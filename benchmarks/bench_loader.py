"""Throughput of the training data loader alone (no model step): batches/s per recipe.

Each recipe's loader is built as a training run builds it (the model's declared needs, the
objectives' data sides) over toyworld, then timed over ``--batches`` batches, ``--rounds``
times after a warm-up; the median is printed. Decoding runs in the main process with
``--workers 0`` (the cost of the stages themselves), in loader workers otherwise.

    mmptm data toyworld --out /tmp/tw --languages en,de,fr,ru,es
    mmptm tokenizer train --input '/tmp/tw/mono/train-*.tar' --out /tmp/tw/tokenizer \
        --vocab-size 2000 --model-type bpe
    .venv/bin/python benchmarks/bench_loader.py --data /tmp/tw
    # audio recipes: toyworld's audio views (and an MFCC codebook for hubert_tiny)
    mmptm data toyworld --out /tmp/tw --views audio,speech
    mmptm units fit --shards '/tmp/tw/audio/train-*.tar' --k 32 --audio-features mfcc \
        --out /tmp/tw/audio/mfcc_codebook.npy
    .venv/bin/python benchmarks/bench_loader.py --data /tmp/tw \
        --recipes clap_tiny,wav2vec2_tiny,speechbert_tiny --workers 0
    # video recipes: toyworld's video views (and a codebook for videobert_tiny)
    mmptm data toyworld --out /tmp/tw --languages en,de,fr,ru,es \
        --views image_text,video,video_features  # video_clip_tiny: images too
    mmptm units fit --shards '/tmp/tw/video_features/train-*.tar' --k 256 \
        --out /tmp/tw/video_features/codebook.npy
    .venv/bin/python benchmarks/bench_loader.py --data /tmp/tw \
        --recipes video_clip_tiny,videobert_tiny,cbt_tiny --workers 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from mmptm.data.pipeline import Loader, stream_config
from mmptm.encoders.base import VocabInfo
from mmptm.models.load import build_model
from mmptm.models.pretrain import data_transforms
from mmptm.recipe import load_run_config
from mmptm.studies import relocated

ROOT = Path(__file__).resolve().parents[1]
VL = ("clip_tiny", "vilt_tiny", "visualbert_tiny", "uniter_tiny", "lxmert_tiny", "albef_tiny")


def recipe_overrides(recipe: str, data: Path, workers: int) -> list[str]:
    """Point a tiny recipe's toyworld paths (shards of every source, tokenizer, codebooks) at
    ``data``."""
    return [*relocated(recipe, data), f"data.num_workers={workers}"]


def loader_rate(
    recipe: str, data: Path, workers: int, batches: int, rounds: int
) -> list[tuple[float, float]]:
    """(batches per wall second, per CPU second of this process) of ``rounds`` timed blocks
    of ``batches`` batches each. With ``workers=0`` the CPU rate is the steadier measure on
    a shared machine: other processes' load does not count against it."""
    cfg = load_run_config(recipe, recipe_overrides(
        recipe, data, workers
    ))  # fmt: skip
    model, tok = build_model(cfg)
    transforms = data_transforms(cfg.model, VocabInfo.from_tokenizer(tok))
    stream = stream_config(cfg.data, tok, needs=model.data_needs(), transforms=transforms)
    it = iter(Loader(stream, workers))
    for _ in range(3):  # warm-up: workers start, the shuffle buffer fills
        next(it)
    rates = []
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(batches):
            next(it)
        rates.append((batches / (time.perf_counter() - t), batches / (time.process_time() - c)))
    return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="toyworld dir with tokenizer.model")
    p.add_argument("--recipes", default=",".join((*VL, "xlm_tlm_tiny")))
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batches", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"| recipe | batches/s (median of {args.rounds}) | batches per CPU-s | rounds (wall) |")
    print("|---|---|---|---|")
    for recipe in args.recipes.split(","):
        rates = loader_rate(recipe, args.data, args.workers, args.batches, args.rounds)
        wall = statistics.median(r[0] for r in rates)
        cpu = statistics.median(r[1] for r in rates)
        shown = ", ".join(f"{r[0]:.1f}" for r in rates)
        print(f"| {recipe} | {wall:.1f} | {cpu:.1f} | {shown} |", flush=True)


if __name__ == "__main__":
    main()
