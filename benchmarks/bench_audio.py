"""Clips/s the audio plug-in decodes (+ features) in one loader worker: waveform vs fbank vs logmel.

Synthetic flac clips (band-limited noise plus a few tones, roughly speech-like in how well
flac compresses them; ``--source-seconds`` long at each ``--rates`` source rate, 16-bit)
are read the way a training loader worker reads them: ``AudioData.decode`` on one torch
thread with the sample's generator, i.e. the header, a random ``--seconds`` window read
with soundfile, resampling to 16 kHz, then the features and their normalisation. The three
feature settings are timed in interleaved blocks, so background load falls on all alike;
it reports clips per CPU-second of the process (what one worker gives with a core of its
own: steady on a shared machine) and, in brackets, per wall-clock second. It also times the
feature step alone on a ``--seconds`` 16 kHz waveform (the work that computing features on
the device instead would take off the workers).

    .venv/bin/python benchmarks/bench_audio.py [--rates 16000,44100] [--source-seconds 10,60]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

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
    warm = synthetic_clip(args.seconds, 16000, 99)
    for _ in range(50):  # untimed: the first timed block ran ~15% slow without it
        for pl in plugins.values():
            pl.decode({"flac": warm}, {}, random.Random(0))
    rows = []
    for rate in (int(r) for r in args.rates.split(",")):
        for source_s in (float(s) for s in args.source_seconds.split(",")):
            clips = [synthetic_clip(source_s, rate, s) for s in range(args.clips)]
            kb = statistics.mean(len(c) for c in clips) / 1024
            print(f"\nflac {source_s:g} s at {rate} Hz ({kb:.0f} KiB), window {args.seconds:g} s")
            g = random.Random(0)
            steps = {
                f: lambda c, pl=pl, g=g: pl.decode({"flac": c}, {}, g) for f, pl in plugins.items()
            }
            cpu = timed(steps, clips, args.rounds, args.steps)
            rows.append((rate, source_s, kb, cpu))
    wave = 0.1 * torch.randn(round(args.seconds * 16000))
    features = {f: lambda w, pl=plugins[f]: pl.spectrogram(w) for f in ("fbank", "logmel")}
    feature_cpu = timed(features, [wave], args.rounds, args.steps)
    print("\nclips/s per CPU-second of one worker (wall-clock clips/s in brackets)")
    print("| source | flac | waveform | fbank | logmel |")
    print("|---|---|---|---|---|")
    for rate, source_s, kb, cpu in rows:
        cells = " | ".join(f"{cpu[f][0]:.0f} ({cpu[f][1]:.0f})" for f in FEATURES)
        print(f"| {source_s:g} s at {rate / 1000:g} kHz | {kb:.0f} KiB | {cells} |")
    print(f"\nfeatures alone on {args.seconds:g} s at 16 kHz, CPU ms per clip: "
          + ", ".join(f"{f} {1000 / r[0]:.2f}" for f, r in feature_cpu.items()))  # fmt: skip


def timed(
    steps: dict[str, Callable[[Any], Any]], inputs: list[Any], rounds: int, per_round: int
) -> dict[str, tuple[float, float]]:
    """(median calls per CPU-second, median calls per wall-second) of each step, timed in
    interleaved blocks. CPU time is what one worker needs from a core of its own; the
    wall clock also counts waiting for the cores other processes hold (a shared machine)."""
    for fn in steps.values():  # warm-up: allocator, caches, the mel transform
        for i in range(per_round):
            fn(inputs[i % len(inputs)])
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    wall: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            c0, w0 = time.process_time(), time.perf_counter()
            for i in range(per_round):
                fn(inputs[i % len(inputs)])
            cpu[name].append(per_round / (time.process_time() - c0))
            wall[name].append(per_round / (time.perf_counter() - w0))
    return {n: (statistics.median(cpu[n]), statistics.median(wall[n])) for n in steps}


if __name__ == "__main__":
    main()
