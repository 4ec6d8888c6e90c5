"""Time one text-MLM training step of mmptm against HF ``BertForMaskedLM`` at equal shapes.

A step is forward, backward, ``AdamW.step`` and ``zero_grad``. Both models see the same
masked batches, thread count and optimiser; timed blocks alternate mmptm / HF so background
load hits both alike. The last line printed is ``ratio=<mmptm samples/s ÷ HF samples/s>``.

    .venv/bin/python benchmarks/bench_pretrain.py            # CPU, all cores
    .venv/bin/python benchmarks/bench_pretrain.py --device cuda --bf16
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))

from harness import time_interleaved

from mmptm.config import from_dict
from mmptm.encoders.base import VocabInfo
from mmptm.models.pretrain import PretrainModel, data_transforms
from mmptm.recipe import ModelConfig

Batch = dict[str, torch.Tensor]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per model (min 1)")
    p.add_argument("--rounds", type=int, default=5, help="timed blocks per model")
    p.add_argument("--steps", type=int, default=10, help="steps per timed block")
    p.add_argument("--threads", type=int, default=None, help="default: all usable cores")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (meant for cuda)")
    p.add_argument(
        "--peak-tflops", type=float, default=None, help="device peak, to print MFU as a percentage"
    )
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build_mmptm(args: argparse.Namespace, vocab: VocabInfo) -> tuple[ModelConfig, PretrainModel]:
    cfg = from_dict(
        ModelConfig,
        {
            "width": args.hidden,
            "encoders": {"text": {"type": "text", "max_positions": 512, "dropout": 0.1}},
            "fusion": {
                "type": "single_stream",
                "pooler": False,
                "transformer": {
                    "layers": args.layers,
                    "heads": args.heads,
                    "mlp_ratio": 4.0,
                    "dropout": 0.1,
                    "attn_dropout": 0.1,
                    # BERT's post-LN layout, so both models do the same math
                    "prenorm": False,
                },
            },
            "objectives": {"mlm": {"type": "mlm"}},
        },
    )
    return cfg, PretrainModel(cfg, vocab)


def build_hf(args: argparse.Namespace) -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=512,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        # SDPA is HF's fastest CPU attention path (eager materialises the score matrix)
        attn_implementation="sdpa",
    )
    return BertForMaskedLM(cfg)


def make_batches(
    args: argparse.Namespace, cfg: ModelConfig, vocab: VocabInfo, n: int
) -> list[Batch]:
    """``n`` masked batches; both models cycle through the same list."""
    transforms = data_transforms(cfg, vocab)
    g = torch.Generator().manual_seed(args.seed)
    first_real = max(vocab.special_ids) + 1
    batches = []
    for i in range(n):
        ids = torch.randint(first_real, args.vocab, (args.batch, args.seq), generator=g)
        batch: Batch = {
            "input_ids": ids,
            "attention_mask": torch.ones(args.batch, args.seq, dtype=torch.bool),
        }
        for t in transforms:
            batch = t(batch, torch.Generator().manual_seed(i))
        batches.append(batch)
    return batches


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def n_params(module: nn.Module) -> int:
    # parameters() de-duplicates tied weights, so tied decoders count once
    return sum(p.numel() for p in module.parameters())


def step_fns(
    mm: PretrainModel, hf: nn.Module, autocast: Callable[[], contextlib.AbstractContextManager]
) -> dict[str, Callable[[Batch], torch.Tensor]]:
    """One closure per model running a full training step and returning the (detached) loss."""
    opt_mm = torch.optim.AdamW(mm.parameters(), lr=1e-4)
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4)

    def mm_step(b: Batch) -> torch.Tensor:
        with autocast():
            loss = mm(b).loss
        loss.backward()
        opt_mm.step()
        opt_mm.zero_grad()
        return loss.detach()

    def hf_step(b: Batch) -> torch.Tensor:
        with autocast():
            loss = hf(
                input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["mlm_labels"]
            ).loss
        loss.backward()
        opt_hf.step()
        opt_hf.zero_grad()
        return loss.detach()

    return {"mmptm": mm_step, "hf": hf_step}


def flops_per_step(
    args: argparse.Namespace, encoder_params: int, head_params: int, head_positions: float
) -> float:
    """6·N·tokens for the encoder stack plus 6·N_head·positions for the LM head actually run.

    Attention-score FLOPs (12·layers·seq·hidden per token, ~4% here) and embeddings are left
    out, as in the usual 6·N estimate.
    """
    tokens = args.batch * args.seq
    return 6 * encoder_params * tokens + 6 * head_params * head_positions


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def autocast() -> contextlib.AbstractContextManager:
        if not args.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16)

    import transformers

    vocab = VocabInfo(
        vocab_size=args.vocab,
        pad_id=0,
        mask_id=4,
        cls_id=2,
        sep_id=3,
        special_ids=frozenset({0, 1, 2, 3, 4}),
    )
    cfg, mm = build_mmptm(args, vocab)
    hf = build_hf(args)
    mm.to(device).train()
    hf.to(device).train()
    batches = [to_device(b, device) for b in make_batches(args, cfg, vocab, args.steps)]

    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in _lscpu() if ln.startswith("Model name")),
        platform.processor() or "?",
    )
    hw = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
    print(
        f"torch {torch.__version__}  transformers {transformers.__version__}  "
        f"device={device} ({hw})  threads={threads}  bf16={args.bf16}  "
        f"hf attn_implementation={hf.config._attn_implementation}"
    )
    print(
        f"shape: batch={args.batch} seq={args.seq} layers={args.layers} hidden={args.hidden} "
        f"heads={args.heads} ffn={4 * args.hidden} vocab={args.vocab}"
    )

    # Parameter counts: total, the Transformer stack alone, and the MLM head minus tied weights.
    mm_total, hf_total = n_params(mm), n_params(hf)
    mm_enc, hf_enc = n_params(mm.fusion.stack), n_params(hf.bert.encoder)
    D, V = args.hidden, args.vocab
    # the head FLOPs include the tied decoder matmul: transform D·D + decoder D·V
    head = D * D + D * V
    print(f"params: mmptm={mm_total:,}  hf={hf_total:,}  diff={mm_total - hf_total:+,}")
    print(f"  transformer stack: mmptm={mm_enc:,}  hf={hf_enc:,}")
    print(
        f"  embeddings: mmptm={n_params(mm.encoders):,} (incl. a modality-type vector of "
        f"{mm.encoders['text'].type_embedding.numel()})  hf={n_params(hf.bert.embeddings):,}"
    )
    print(
        f"  mlm head, decoder tied to word embeddings: mmptm={n_params(mm.objectives):,}  "
        f"hf={hf_total - n_params(hf.bert):,}  (hf pooler: {hf.bert.pooler is not None})"
    )

    masked = statistics.mean(int((b["mlm_labels"] != -100).sum()) for b in batches)
    tokens = args.batch * args.seq
    print(f"masked positions per batch: {masked:.1f} of {tokens} ({masked / tokens:.1%})")

    # Sanity: a finite init loss near ln(V) from both, so we are not timing a broken step.
    with torch.no_grad(), autocast():
        b = batches[0]
        l_mm = float(mm(b).loss)
        l_hf = float(
            hf(
                input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["mlm_labels"]
            ).loss
        )
    print(f"init loss: mmptm={l_mm:.3f}  hf={l_hf:.3f}  ln(V)={math.log(V):.3f}")
    if not all(math.isfinite(x) and abs(x - math.log(V)) < 2.0 for x in (l_mm, l_hf)):
        raise SystemExit("an init loss is not finite or is more than 2 nats from ln(V)")

    steps = step_fns(mm, hf, autocast)
    for name, fn in steps.items():  # a non-finite loss after warmup means a broken step
        if not math.isfinite(float(fn(batches[0]))):
            raise SystemExit(f"{name}: non-finite loss")
    rates = time_interleaved(
        steps,
        batches,
        batch_size=args.batch,
        rounds=args.rounds,
        steps_per_round=args.steps,
        warmup=args.warmup,
        sync=sync,
    )

    med = {name: statistics.median(v) for name, v in rates.items()}
    flops = {
        "mmptm": flops_per_step(args, mm_enc, head, masked),
        "hf": flops_per_step(args, hf_enc, head, tokens),
    }
    print(
        f"{'model':6} {'median samples/s':>17} {'min':>8} {'max':>8} {'GFLOP/step':>11} "
        f"{'GFLOP/s':>8}" + (" MFU" if args.peak_tflops else "")
    )
    for name in steps:
        achieved = flops[name] * med[name] / args.batch
        mfu = f" {achieved / (args.peak_tflops * 1e12):.1%}" if args.peak_tflops else ""
        print(
            f"{name:6} {med[name]:17.1f} {min(rates[name]):8.1f} {max(rates[name]):8.1f} "
            f"{flops[name] / 1e9:11.2f} {achieved / 1e9:8.1f}{mfu}"
        )
    # Adjacent blocks share most of their background load, so per-round ratios and the best
    # rounds are cross-checks on the ratio of medians when the machine is busy.
    paired = [a / b for a, b in zip(rates["mmptm"], rates["hf"])]
    print(
        f"per-round ratios: {' '.join(f'{r:.2f}' for r in paired)}  "
        f"(median {statistics.median(paired):.3f}); "
        f"best-round ratio {max(rates['mmptm']) / max(rates['hf']):.3f}"
    )
    spread = {n: (max(v) - min(v)) / statistics.median(v) for n, v in rates.items()}
    if max(spread.values()) > 0.2:
        print(
            f"warning: rounds vary by up to {max(spread.values()):.0%}: background load? "
            "(with busy cores, --threads 1 avoids OpenMP threads waiting on descheduled peers)"
        )
    print(f"ratio={med['mmptm'] / med['hf']:.3f}")


def _lscpu() -> list[str]:
    try:
        return subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return []


if __name__ == "__main__":
    main()
