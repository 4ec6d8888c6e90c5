"""Clips/s the audio plug-in decodes (+ features) in one loader worker: waveform vs fbank vs logmel.

Synthetic flac clips (band-limited noise plus a few tones, roughly speech-like in how well
flac compresses them; ``--source-seconds`` long at each ``--rates`` source rate, 16-bit)
are read the way a training loader worker reads them: ``AudioData.decode`` on one torch
thread with the sample's generator, i.e. the header, a random ``--seconds`` window read
with soundfile, resampling to 16 kHz, then the features and their normalisation. The three
feature settings are timed interleaved (harness.time_interleaved), so background load
falls on all alike. It also times the feature step alone on a ``--seconds`` 16 kHz
waveform (what computing features on the device instead would move off the workers).

    .venv/bin/python benchmarks/bench_audio.py [--rates 16000,44100] [--source-seconds 10,60]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import time_interleaved

from mmptm.modalities import DataContext
from mmptm.modalities.audio import AudioData
from mmptm.modalities.audio_io import encode_audio

FEATURES = ("waveform", "fbank", "logmel")


def synthetic_clip(seconds: float, rate: int, seed: int) -> bytes:
    """Band-limited noise with a slow envelope plus three tones, as 16-bit flac."""
    rng = np.random.default_rng(seed)
    n = round(seconds * rate)
    t = np.arange(n) / rate
    noise = np.convolve(rng.standard_normal(n), np.ones(6) / 6, mode="same")
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t) ** 2
    tones = sum(np.sin(2 * np.pi * f * t) for f in rng.uniform(100, 3000, 3))
    wave = 0.15 * envelope * noise + 0.05 * tones
    return encode_audio(wave.astype(np.float32), rate, "flac")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="16000,44100", help="source sample rates, Hz")
    p.add_argument("--source-seconds", default="10,60", help="clip lengths in the shards")
    p.add_argument("--seconds", type=float, default=10.0, help="max_seconds (the window)")
    p.add_argument("--n-mels", type=int, default=80)
    p.add_argument("--clips", type=int, default=4, help="distinct clips per setting")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="clips per timed block")
    args = p.parse_args()
    torch.set_num_threads(1)  # as in a DataLoader worker
    plugins = {
        f: AudioData(
            AudioData.Config(features=f, n_mels=args.n_mels, max_seconds=args.seconds),
            views=["audio"],
            context=DataContext(),
        )
        for f in FEATURES
    }
    rows = []
    for rate in (int(r) for r in args.rates.split(",")):
        for source_s in (float(s) for s in args.source_seconds.split(",")):
            clips = [synthetic_clip(source_s, rate, s) for s in range(args.clips)]
            kb = statistics.mean(len(c) for c in clips) / 1024
            print(f"\nflac {source_s:g} s at {rate} Hz ({kb:.0f} KiB), window {args.seconds:g} s")
            g = random.Random(0)
            rates = time_interleaved(
                {
                    f: lambda c, pl=pl, g=g: pl.decode({"flac": c}, {}, g)
                    for f, pl in plugins.items()
                },
                clips, batch_size=1, rounds=args.rounds, steps_per_round=args.steps, warmup=2,
            )  # fmt: skip
            rows.append((rate, source_s, kb, {f: statistics.median(v) for f, v in rates.items()}))
    wave = 0.1 * torch.randn(round(args.seconds * 16000))
    feature_ms = {}
    for f in ("fbank", "logmel"):
        pl = plugins[f]
        pl.spectrogram(wave)
        times = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            for _ in range(args.steps):
                pl.spectrogram(wave)
            times.append((time.perf_counter() - t0) / args.steps * 1000)
        feature_ms[f] = statistics.median(times)
    print("\n| source | flac | waveform clips/s | fbank clips/s | logmel clips/s |")
    print("|---|---|---|---|---|")
    for rate, source_s, kb, med in rows:
        print(f"| {source_s:g} s at {rate / 1000:g} kHz | {kb:.0f} KiB | "
              + " | ".join(f"{med[f]:.0f}" for f in FEATURES) + " |")  # fmt: skip
    print(f"\nfeatures alone on {args.seconds:g} s at 16 kHz (one thread): "
          + ", ".join(f"{f} {ms:.2f} ms" for f, ms in feature_ms.items()))  # fmt: skip


if __name__ == "__main__":
    main()
