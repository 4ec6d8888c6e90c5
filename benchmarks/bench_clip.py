"""Time one CLIP training step of mmptm against open_clip's own at equal model shapes (CPU).

Both sides are built from the same open_clip model config (mmptm's through
``open_clip_model_config``, the importer's mapping) and trained on the same images and the same
token ids with AdamW; open_clip's step is its own ``CLIP`` plus ``ClipLoss``. Blocks of steps
alternate (``harness.time_interleaved``) and the script prints each regime's ratio
(mmptm samples/s ÷ open_clip samples/s) and the FLOPs each side computes per step
(``harness.step_gflop``).

Two input regimes, the same captions for both libraries:

- ``full``: every caption fills open_clip's 77-token context (both compute the same shapes);
- ``captions``: English toyworld captions through open_clip's own tokenizer. open_clip's
  tokenizer pads every caption to 77 tokens and its text tower runs all 77; mmptm's text
  plug-in pads a batch to its longest caption and masks the padding, as it does in training.

    .venv/bin/python benchmarks/bench_clip.py [--model ViT-B-32 --batch 32 --rounds 3 --steps 2]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import report_ratio, step_gflop, time_interleaved

from mmptm.encoders.base import VocabInfo
from mmptm.models.open_clip_import import open_clip_model_config
from mmptm.models.pretrain import PretrainModel

#: a small CLIP of the same layout (ViT + causal text tower), for quick runs
SMALL = {
    "embed_dim": 256,
    "vision_cfg": {"image_size": 128, "layers": 6, "width": 384, "patch_size": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 256, "heads": 4, "layers": 6},
}
#: the smallest of that layout (the tests); 77 tokens, as open_clip's tokenizer writes
TINY = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "patch_size": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ViT-B-32", help="open_clip config name, small or tiny")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--regimes", default="full,captions")
    p.add_argument("--threads", type=int, default=None)
    return p.parse_args(argv)


def toy_captions(n: int) -> list[str]:
    """English captions of toyworld scenes (train split, seed 0): the text regime's captions."""
    from mmptm.toyworld.language import captions
    from mmptm.toyworld.scene import sample_scene

    return [captions(sample_scene(0, "train", i), ["en"])["en"] for i in range(n)]


def token_batches(regime: str, batch: int, n: int, vocab_size: int) -> list[torch.Tensor]:
    """[B,77] open_clip token ids per batch (0 after the end-of-text token)."""
    import open_clip

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        if regime == "full":
            ids = torch.randint(1, vocab_size - 2, (batch, 77), generator=g)
            ids[:, 0], ids[:, -1] = vocab_size - 2, vocab_size - 1
        else:
            ids = open_clip.tokenize(toy_captions((i + 1) * batch)[i * batch :])
        out.append(ids)
    return out


def mmptm_batch(ids: torch.Tensor, pixels: torch.Tensor, vocab_size: int) -> dict:
    """What mmptm's text plug-in collates: trimmed to the longest caption, padding masked."""
    eot_B = (ids == vocab_size - 1).int().argmax(1)
    L = int(eot_B.max()) + 1
    mask = torch.arange(L)[None, :] <= eot_B[:, None]
    return {"pixels": pixels, "input_ids": ids[:, :L].clone(), "attention_mask": mask}


def main(argv: list[str] | None = None) -> dict[str, dict]:
    """Time each regime; returns {regime: {"ratio", "gflop": {side: GFLOP/step}, "tokens"}}."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    import open_clip
    from open_clip.loss import ClipLoss

    own = {"small": SMALL, "tiny": TINY}
    oc_cfg = own.get(args.model) or open_clip.get_model_config(args.model)
    if oc_cfg is None:
        raise SystemExit(f"--model {args.model!r}: not an open_clip config (nor small, tiny)")
    oc_cfg = {k: oc_cfg[k] for k in ("embed_dim", "vision_cfg", "text_cfg")}
    V = oc_cfg["text_cfg"]["vocab_size"]
    S, B = oc_cfg["vision_cfg"]["image_size"], args.batch
    vocab = VocabInfo(
        vocab_size=V,
        mask_id=-1,
        cls_id=V - 2,
        sep_id=V - 1,
        special_ids=frozenset({V - 2, V - 1}),
        pad_is_text=True,
    )
    torch.manual_seed(0)
    ours = PretrainModel(open_clip_model_config(oc_cfg), vocab).train()
    theirs = open_clip.CLIP(**oc_cfg).train()
    n_ours = sum(p.numel() for p in ours.parameters())
    n_theirs = sum(p.numel() for p in theirs.parameters())
    print(f"torch {torch.__version__} open_clip {open_clip.__version__} "
          f"threads={torch.get_num_threads()} model={args.model} batch={B} "
          f"params mmptm={n_ours:,} open_clip={n_theirs:,}")  # fmt: skip
    loss_fn = ClipLoss()
    opts = {
        "mmptm": torch.optim.AdamW(ours.parameters(), lr=1e-4),
        "open_clip": torch.optim.AdamW(theirs.parameters(), lr=1e-4),
    }
    fwd = {
        "mmptm": lambda b: ours(b["mmptm"]).loss,
        "open_clip": lambda b: loss_fn(*theirs(b["pixels"], b["ids"])),
    }

    def step(name):
        def fn(b):
            fwd[name](b).backward()
            opts[name].step()
            opts[name].zero_grad()

        return fn

    g = torch.Generator().manual_seed(1)
    results = {}
    for regime in args.regimes.split(","):
        data = []
        for ids in token_batches(regime, B, 2, V):
            pixels = torch.randn(B, 3, S, S, generator=g)
            data.append({"pixels": pixels, "ids": ids, "mmptm": mmptm_batch(ids, pixels, V)})
        lengths = [b["mmptm"]["input_ids"].shape[1] for b in data]
        f = {name: step_gflop(fwd[name], data[0]) for name in fwd}
        for o in opts.values():
            o.zero_grad()
        print(f"\n{regime}: text tokens per batch mmptm {lengths} open_clip 77; GFLOP/step "
              f"mmptm {f['mmptm']:.4g} open_clip {f['open_clip']:.4g}")  # fmt: skip
        rates = time_interleaved(
            {name: step(name) for name in fwd},
            data, batch_size=B, rounds=args.rounds, steps_per_round=args.steps,
            warmup=args.warmup,
        )  # fmt: skip
        ratio = report_ratio(rates, "mmptm", "open_clip", f"_{regime}")
        results[regime] = {"ratio": ratio, "gflop": f, "tokens": lengths}
    return results


if __name__ == "__main__":
    main()
