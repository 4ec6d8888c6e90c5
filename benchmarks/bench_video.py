"""Clips/s the video plug-in decodes in one loader worker, against decoding every frame.

Synthetic clips (a drifting texture with a moving square, ``--source`` pixels, ``--fps``,
``--seconds`` each, a key frame every ``--gop`` frames) are written with ``encode_video``
as mp4; each is then read the way a training loader worker reads it: ``VideoData.decode``
with one FFmpeg thread, T = ``--frames`` frames spread over the clip (a random frame per
segment), resized and centre-cropped to each ``--sizes`` and normalised. The peer, in the
same process and interleaved with it, decodes every frame of the clip (one thread) and
converts the same T frames (what a decoder without seeking does). It prints clips/s (median
of ``--rounds``), the ratio, and the frames each decodes per clip.

    .venv/bin/python benchmarks/bench_video.py [--sizes 64,224] [--seconds 10,60] [--gop 50]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import time_interleaved

from mmptm.modalities import DataContext
from mmptm.modalities.video import (
    DecodeStats,
    VideoData,
    _scaler,
    clip_times,
    decode_clip,
    encode_video,
)


def synthetic_clip(seconds: float, fps: float, w: int, h: int, gop: int, seed: int) -> bytes:
    """A drifting smooth texture plus a moving square, as mp4 bytes."""
    rng = np.random.default_rng(seed)
    n = round(seconds * fps)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    k = rng.uniform(0.02, 0.08, (3, 2))
    frames = np.empty((n, h, w, 3), np.uint8)
    for t in range(n):
        for c in range(3):
            wave = np.sin(k[c, 0] * (xx + 2 * t) + k[c, 1] * yy + c)
            frames[t, :, :, c] = (127 + 100 * wave).astype(np.uint8)
        x0, y0 = (5 * t) % (w - 32), (3 * t) % (h - 32)
        frames[t, y0 : y0 + 32, x0 : x0 + 32] = 255
    return encode_video(frames, fps, "mp4", quality=23, options={"g": str(gop)})


def decode_everything(data: bytes, frames: int, size: int, rng: random.Random) -> int:
    """The peer: decode every frame (one thread), convert the chosen T ones; frames decoded."""
    import av

    scaler = _scaler(
        os.getpid()
    )  # the plug-in's cached FFmpeg scaler, so both pay the same per frame
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        n, rate = stream.frames, float(stream.average_rate)
        want = {round(t * rate) for t in clip_times(n, rate, frames, rng=rng)}
        count = 0
        for i, frame in enumerate(container.decode(stream)):
            count += 1
            if i in want:
                scaler.reformat(
                    frame, width=size, height=size, format="rgb24", threads=1
                ).to_ndarray()
    return count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="64,224")
    p.add_argument("--seconds", default="10,60")
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--source", default="320x240", help="WxH of the encoded clips")
    p.add_argument("--fps", type=float, default=25.0)
    p.add_argument("--gop", type=int, default=50, help="frames between key frames")
    p.add_argument("--clips", type=int, default=3, help="distinct clips per length")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=6, help="clips per timed block")
    args = p.parse_args()
    torch.set_num_threads(1)
    w, h = (int(v) for v in args.source.split("x"))
    print(f"source {w}x{h} at {args.fps:g} fps, key frame every {args.gop} frames, "
          f"T={args.frames}, one decoding thread", flush=True)  # fmt: skip
    rows = []
    for seconds in (float(s) for s in args.seconds.split(",")):
        clips = [synthetic_clip(seconds, args.fps, w, h, args.gop, s) for s in range(args.clips)]
        for size in (int(s) for s in args.sizes.split(",")):
            cfg = VideoData.Config(size=size, mean=[0.5] * 3, std=[0.5] * 3,
                                   frames=args.frames, threads=1)  # fmt: skip
            plugin = VideoData(cfg, views=["video"], context=DataContext())
            rng = random.Random(0)
            rates = time_interleaved(
                {
                    "plug-in": lambda c, p=plugin, g=rng: p.decode({"mp4": c}, {}, g),
                    "decode all": lambda c, s=size, g=rng: decode_everything(c, args.frames, s, g),
                },
                clips, batch_size=1, rounds=args.rounds, steps_per_round=args.steps, warmup=1,
            )  # fmt: skip
            stats = DecodeStats()
            for i, c in enumerate(clips):
                decode_clip(c, lambda n, r, i=i: clip_times(n, r, args.frames,
                            rng=random.Random(i)), size=size, threads=1, stats=stats)  # fmt: skip
            ours, peer = statistics.median(rates["plug-in"]), statistics.median(rates["decode all"])
            total = round(seconds * args.fps)
            rows.append((seconds, size, ours, peer, stats.decoded / len(clips), total))
    print("\n| clip | size | clips/s plug-in | clips/s decode all | ratio | frames decoded |")
    print("|---|---|---|---|---|---|")
    for seconds, size, ours, peer, decoded, total in rows:
        print(f"| {seconds:g} s | {size} | {ours:.1f} | {peer:.1f} | {ours / peer:.2f} | "
              f"{decoded:.0f} of {total} |")  # fmt: skip


if __name__ == "__main__":
    main()
