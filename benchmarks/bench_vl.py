"""Time one vision-language pre-training step of mmptm against HF transformers at equal shapes.

- single stream: mmptm `visualbert` (text + regions, MLM + ITM) vs `VisualBertForPreTraining`
  (MLM + sentence-image prediction);
- two stream: mmptm `lxmert` (MLM, object-class MRC, feature regression, ITM) vs
  `LxmertForPreTraining` with the same tasks (no attribute or QA heads).

Both see the same batches (masked text, masked regions, swapped negatives from mmptm's own
data sides), the same AdamW, threads and shapes; blocks alternate. Prints `ratio_single=` and
`ratio_two=` (mmptm samples/s ÷ HF samples/s).

    .venv/bin/python benchmarks/bench_vl.py [--rounds 5 --steps 5 --batch 32]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import report_ratio, step_gflop, time_interleaved

from mmptm.config import from_dict
from mmptm.encoders.base import VocabInfo
from mmptm.models.pretrain import PretrainModel, data_transforms
from mmptm.recipe import ModelConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=32, help="text tokens")
    p.add_argument("--regions", type=int, default=36)
    p.add_argument("--feat", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4, help="single stream / lxmert language")
    p.add_argument("--object-layers", type=int, default=2)
    p.add_argument("--cross-layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--classes", type=int, default=1600)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    return p.parse_args(argv)


def batches(args, cfg: ModelConfig, vocab: VocabInfo, n: int) -> list[dict]:
    """Random text + regions run through mmptm's own data sides (negatives, masking)."""
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        B, L, R = args.batch, args.seq, args.regions
        ids = torch.randint(5, args.vocab, (B, L), generator=g)
        ids[:, 0], ids[:, -1] = 2, 3
        x1y1 = torch.rand(B, R, 2, generator=g) * 0.5
        probs = torch.softmax(torch.randn(B, R, args.classes, generator=g), -1)
        b = {
            "input_ids": ids,
            "attention_mask": torch.ones(B, L, dtype=torch.bool),
            "region_feats": torch.rand(B, R, args.feat, generator=g),
            "region_boxes": torch.cat([x1y1, x1y1 + 0.3], -1),
            "region_mask": torch.ones(B, R, dtype=torch.bool),
            "region_probs": probs,
            "region_labels": probs.argmax(-1),
        }
        for t in data_transforms(cfg, vocab):
            b = t(b, g)
        out.append(b)
    return out


def mmptm_model(args, fusion: dict, objectives: dict, vocab: VocabInfo):
    cfg = from_dict(
        ModelConfig,
        {
            "width": args.hidden,
            "encoders": {
                "text": {"type": "text", "max_positions": 512},
                "regions": {"type": "regions", "feature_dim": args.feat},
            },
            "fusion": fusion,
            "objectives": objectives,
        },
    )
    return cfg, PretrainModel(cfg, vocab).train()


def step(model, loss_fn):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def fn(b):
        loss = loss_fn(b)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return fn


def work(mm, hf, hf_loss, batch) -> float:
    """Print each side's GFLOPs per step and return HF's ÷ mmptm's: the speed ratio that
    equal efficiency per FLOP would give."""
    ours, theirs = step_gflop(lambda b: mm(b).loss, batch), step_gflop(hf_loss, batch)
    mm.zero_grad(), hf.zero_grad()
    print(f"  GFLOP/step mmptm {ours:.1f} hf {theirs:.1f} (hf / mmptm {theirs / ours:.3f})")
    return theirs / ours


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Time both pairs; returns the speed ratios and HF ÷ mmptm FLOP ratios."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    import transformers

    vocab = VocabInfo(vocab_size=args.vocab, special_ids=frozenset({0, 1, 2, 3, 4}))
    D, H = args.hidden, args.heads
    print(f"torch {torch.__version__} transformers {transformers.__version__} "
          f"threads={torch.get_num_threads()} batch={args.batch} text={args.seq} "
          f"regions={args.regions} feat={args.feat} hidden={D} heads={H}")  # fmt: skip

    # -- single stream: VisualBERT ------------------------------------------------------------
    transformer = {"layers": args.layers, "heads": H, "prenorm": False}
    cfg, mm = mmptm_model(
        args,
        {"type": "single_stream", "transformer": transformer},
        {"itm": {"type": "itm", "swap_keys": ["region_*"]}, "mlm": {"type": "mlm"}},
        vocab,
    )
    hf = transformers.VisualBertForPreTraining(
        transformers.VisualBertConfig(
            vocab_size=args.vocab,
            hidden_size=D,
            num_hidden_layers=args.layers,
            num_attention_heads=H,
            intermediate_size=4 * D,
            visual_embedding_dim=args.feat,
        )
    ).train()
    data = batches(args, cfg, vocab, 4)

    def hf_visualbert(b):
        labels = torch.cat([b["mlm_labels"], torch.full((args.batch, args.regions), -100)], 1)
        return hf(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"].long(),
            visual_embeds=b["region_feats"], visual_attention_mask=b["region_mask"].long(),
            labels=labels, sentence_image_labels=b["itm_labels"],
        ).loss  # fmt: skip

    print(f"\nsingle stream: params mmptm={sum(p.numel() for p in mm.parameters()):,} "
          f"hf={sum(p.numel() for p in hf.parameters()):,}")  # fmt: skip
    gflop_single = work(mm, hf, hf_visualbert, data[0])
    rates = time_interleaved(
        {"mmptm": step(mm, lambda b: mm(b).loss), "hf": step(hf, hf_visualbert)},
        data, batch_size=args.batch, rounds=args.rounds, steps_per_round=args.steps,
        warmup=args.warmup,
    )  # fmt: skip
    single = report_ratio(rates, "mmptm", "hf", "_single")

    # -- two stream: LXMERT --------------------------------------------------------------------
    fusion = {
        "type": "two_stream", "variant": "lxmert", "language_layers": args.layers,
        "object_layers": args.object_layers, "cross_layers": args.cross_layers,
        "language_heads": H, "vision_heads": H,
    }  # fmt: skip
    objectives = {
        "itm": {"type": "itm", "swap_keys": ["region_*"]},
        "mlm": {"type": "mlm"},
        "mrc": {"type": "mrc", "num_classes": args.classes, "target": "labels"},
        "mrfr": {"type": "mrfr"},
    }
    cfg, mm = mmptm_model(args, fusion, objectives, vocab)
    hf = transformers.LxmertForPreTraining(
        transformers.LxmertConfig(
            vocab_size=args.vocab,
            hidden_size=D,
            num_attention_heads=H,
            intermediate_size=4 * D,
            l_layers=args.layers,
            r_layers=args.object_layers,
            x_layers=args.cross_layers,
            visual_feat_dim=args.feat,
            visual_pos_dim=4,
            num_object_labels=args.classes,
            task_qa=False,
            visual_attr_loss=False,
        )
    ).train()
    data = batches(args, cfg, vocab, 4)

    def hf_lxmert(b):
        masked = b["region_masked"].float()
        return hf(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"].long(),
            visual_feats=b["region_feats"], visual_pos=b["region_boxes"],
            visual_attention_mask=b["region_mask"].long(), labels=b["mlm_labels"],
            obj_labels={"obj": (b["region_labels"], masked),
                        "feat": (b["region_target_feats"], masked)},
            matched_label=b["itm_labels"],
        ).loss  # fmt: skip

    print(f"\ntwo stream: params mmptm={sum(p.numel() for p in mm.parameters()):,} "
          f"hf={sum(p.numel() for p in hf.parameters()):,}")  # fmt: skip
    gflop_two = work(mm, hf, hf_lxmert, data[0])
    rates = time_interleaved(
        {"mmptm": step(mm, lambda b: mm(b).loss), "hf": step(hf, hf_lxmert)},
        data, batch_size=args.batch, rounds=args.rounds, steps_per_round=args.steps,
        warmup=args.warmup,
    )  # fmt: skip
    two = report_ratio(rates, "mmptm", "hf", "_two")
    print(f"\nratio_single={single:.3f} ratio_two={two:.3f} "
          f"flop_ratio_single={gflop_single:.3f} flop_ratio_two={gflop_two:.3f}")  # fmt: skip
    return {"single": single, "two": two, "flop_single": gflop_single, "flop_two": gflop_two}


if __name__ == "__main__":
    main()
