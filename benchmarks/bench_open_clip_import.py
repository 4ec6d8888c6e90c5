"""`mmptm import open_clip` at the published shapes: parity with open_clip, and speed.

For ViT-B-32 and RN50 (open_clip's own random initialisation, every tensor then moved a
little so that no zero bias or unit scale hides a mapping; nothing is downloaded) it saves
the state dict, imports it, embeds the same images and captions with both and prints the
largest absolute difference of the normalised image and text embeddings and of the logits,
then times an embedding batch of each tower in both, interleaved (see harness.py), and
prints the ratio mmptm ÷ open_clip (samples/s).

    .venv/bin/python benchmarks/bench_open_clip_import.py                 # CPU, ~3 min
    .venv/bin/python benchmarks/bench_open_clip_import.py --models ViT-L-14 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import open_clip
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import time_interleaved

from mmptm.models.load import load_pretrained
from mmptm.models.open_clip_import import import_open_clip

CAPTIONS = [
    "a photo of a cat sleeping on a red sofa",
    "Two dogs playing in the SNOW!",
    "a diagram of the human heart, labelled",
    "Ein Hund läuft über die Wiese",
    "猫と犬",
    "it's 3:45pm & the café's closed",
    "a bowl of ramen with an egg",
    " ".join(["long"] * 120),
]


def text_batch(tokenizer, texts, device):
    rows = [tokenizer.build_inputs(tokenizer.encode(t), None, 77)[0] for t in texts]
    L = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_id] * (L - len(r)) for r in rows], device=device)
    mask = torch.tensor([[True] * len(r) + [False] * (L - len(r)) for r in rows], device=device)
    return {"input_ids": ids, "attention_mask": mask}


def bench(name: str, args: argparse.Namespace, device: torch.device, sync) -> tuple:
    """Parity and speed of one model: (name, params, import s, diffs..., rates per tower)."""
    torch.manual_seed(0)
    oc = open_clip.create_model(name).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in oc.state_dict().values():
            if t.dtype.is_floating_point:
                t.add_(0.01 * torch.randn(t.shape, generator=g))
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(oc.state_dict(), Path(tmp) / "model.pt")
        t0 = time.perf_counter()
        import_open_clip(Path(tmp) / "model.pt", name, Path(tmp) / "run")
        seconds = time.perf_counter() - t0
        model, tokenizer, cfg = load_pretrained(str(Path(tmp) / "run"))
    oc, model = oc.to(device), model.to(device)
    head = model.objectives["contrastive"]
    S = cfg.model.encoders["image"].backbone.image_size
    images = torch.randn(args.batch, 3, S, S, generator=g).to(device)
    texts = (CAPTIONS * args.batch)[: args.batch]
    ours_text = text_batch(tokenizer, texts, device)
    ids = open_clip.tokenize(texts).to(device)
    assert torch.equal(ours_text["input_ids"], ids[:, : ours_text["input_ids"].shape[1]])
    towers = {
        "image": (
            lambda x: head.embed(model.fuse({"pixels": x}), "image"),
            lambda x: oc.encode_image(x, normalize=True),
            images,
        ),
        "text": (
            lambda b: head.embed(model.fuse(b[0]), "text"),
            lambda b: oc.encode_text(b[1], normalize=True),
            (ours_text, ids),
        ),
    }
    with torch.no_grad():
        zi, want_i = (f(images) for f in towers["image"][:2])
        zt, want_t = (f((ours_text, ids)) for f in towers["text"][:2])
        di = (zi - want_i).abs().max().item()
        dt = (zt - want_t).abs().max().item()
        logits = head.scale() * zi @ zt.T
        dl = (logits - oc.get_logits(images, ids)[0]).abs().max().item()
        print(f"{name}: max |Δ| image {di:.1e}, text {dt:.1e}, logits {dl:.1e}")
        rates = {}
        for tower, (ours, theirs, batch) in towers.items():
            print(f"{name} {tower} tower:")
            got = time_interleaved(
                {"mmptm": ours, "open_clip": theirs}, [batch], batch_size=args.batch,
                rounds=args.rounds, steps_per_round=args.steps, warmup=1, sync=sync,
            )  # fmt: skip
            rates[tower] = [statistics.median(got[k]) for k in ("mmptm", "open_clip")]
    n = sum(p.numel() for p in model.parameters()) / 1e6
    return name, n, seconds, di, dt, dl, rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="ViT-B-32,RN50")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = [bench(name, args, device, sync) for name in args.models.split(",")]
    print(f"\nbatch {args.batch} on {device}, torch {torch.__version__}, "
          f"open_clip {open_clip.__version__}")  # fmt: skip
    print(
        "| model | params (M) | import (s) | max abs diff image / text emb. | logits "
        "| image samples/s mmptm / open_clip | text samples/s mmptm / open_clip |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, n, s, di, dt, dl, r in rows:
        (im, io), (tm, to) = r["image"], r["text"]
        print(
            f"| {name} | {n:.1f} | {s:.1f} | {di:.1e} / {dt:.1e} | {dl:.1e} "
            f"| {im:.1f} / {io:.1f} ({im / io:.2f}) | {tm:.1f} / {to:.1f} ({tm / to:.2f}) |"
        )


if __name__ == "__main__":
    main()
