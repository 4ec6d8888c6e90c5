"""`mmptm import wav2vec2` at the published shapes: parity with transformers, and speed.

For wav2vec2-base, HuBERT-base and wav2vec2-large-lv60 shaped models (HF's own random
initialisation: nothing is downloaded) it saves the HF model, imports it, runs both on the
same unpadded waveforms and prints the largest absolute difference of ``last_hidden_state``
(and of ``extract_features`` vs ``targets``), then times inference forwards of both,
interleaved (see harness.py), and prints the ratio mmptm ÷ HF.

    .venv/bin/python benchmarks/bench_audio_import.py                 # CPU, ~2 min
    .venv/bin/python benchmarks/bench_audio_import.py --device cuda --seconds 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import time_interleaved

from mmptm.models.hf_audio_import import import_wav2vec2
from mmptm.models.load import load_pretrained

SHAPES = {
    "wav2vec2-base": (transformers.Wav2Vec2Model, transformers.Wav2Vec2Config, {}),
    "hubert-base": (transformers.HubertModel, transformers.HubertConfig, {}),
    "wav2vec2-large-lv60": (
        transformers.Wav2Vec2Model,
        transformers.Wav2Vec2Config,
        {
            "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
            "intermediate_size": 4096, "feat_extract_norm": "layer",
            "do_stable_layer_norm": True, "conv_bias": True,
        },
    ),
}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    wave = torch.randn(
        args.batch, int(16000 * args.seconds), generator=torch.Generator().manual_seed(0)
    )
    wave = wave.to(device)
    rows = []
    for name in args.shapes.split(","):
        model_cls, cfg_cls, changes = SHAPES[name]
        torch.manual_seed(0)
        hf = model_cls(cfg_cls(**changes)).eval().to(device)
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(Path(tmp) / "hf")
            import_wav2vec2(Path(tmp) / "hf", Path(tmp) / "run")
            enc = load_pretrained(str(Path(tmp) / "run"))[0].encoders["audio"].to(device)
        with torch.no_grad():
            want = hf(wave)
            got = enc({"audio": wave})
            diff = (want.last_hidden_state - got.tokens).abs().max().item()
            scale = want.last_hidden_state.abs().max().item()
            feats = getattr(want, "extract_features", None)
            fdiff = (feats - got.targets).abs().max().item() if feats is not None else float("nan")
            sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
            print(f"{name}: max |Δ| hidden {diff:.2e} (max |h| {scale:.2f}), features {fdiff:.2e}")
            rates = time_interleaved(
                {"mmptm": lambda b, e=enc: e({"audio": b}), "hf": lambda b, m=hf: m(b)},
                [wave], batch_size=args.batch, rounds=args.rounds,
                steps_per_round=args.steps, warmup=1, sync=sync,
            )  # fmt: skip
        ratio = statistics.median(rates["mmptm"]) / statistics.median(rates["hf"])
        n = sum(p.numel() for p in enc.parameters()) / 1e6
        rows.append((name, n, got.tokens.shape[1], diff, fdiff, ratio))
    print(f"\n{args.batch} × {args.seconds:g} s of audio on {device}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")  # fmt: skip
    print("| shape | params (M) | steps | max abs diff hidden | features | speed mmptm ÷ HF |")
    print("|---|---|---|---|---|---|")
    for name, n, T, d, f, r in rows:
        print(f"| {name} | {n:.1f} | {T} | {d:.1e} | {f:.1e} | {r:.2f} |")


if __name__ == "__main__":
    main()
