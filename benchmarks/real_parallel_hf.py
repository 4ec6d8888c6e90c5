"""MLM on the real parallel benchmark's text: mmptm against HF ``BertForMaskedLM``, step for
step (a check of the framework, not a speed benchmark).

Both models start from the same weights (mmptm's initialisation, copied into HF by name) and
see the same batches: the ``mbert_tiny`` recipe's own loader over ``data/real_parallel``
(languages sampled p ∝ n^0.7, dynamic 15% masking), with the recipe's optimiser settings
(AdamW, decoupled decay on matrices, warmup then cosine decay, clipping at 1). mmptm runs in
BERT's post-LN layout so that both compute the same function; a third curve is the recipe
as it is (pre-LN). HF's optimiser is torch AdamW over HF's usual groups (no decay on biases
and LayerNorm weights) on the same schedule; mmptm's modality-type vector, which HF lacks,
is folded into HF's segment embedding and not trained. With ``--dropout 0`` the first two
curves agree to float precision; with dropout they differ by its noise.

    python benchmarks/real_parallel_hf.py --data data/real_parallel --steps 600 [--dropout 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_parallel import recipe_overrides  # noqa: E402

from mmptm.batch import move_to  # noqa: E402
from mmptm.data.pipeline import DataState, Loader, stream_config  # noqa: E402
from mmptm.encoders.base import VocabInfo  # noqa: E402
from mmptm.models.hf_import import HF_TO_MMPTM, compile_names, map_name  # noqa: E402
from mmptm.models.load import build_model  # noqa: E402
from mmptm.models.pretrain import data_transforms  # noqa: E402
from mmptm.recipe import load_run_config  # noqa: E402
from mmptm.train.optim import build_optimizer, lr_factor  # noqa: E402

#: BertForMaskedLM's head names → mmptm's (the encoder's follow ``HF_TO_MMPTM``)
HEAD = {
    "cls.predictions.transform.dense.weight": "objectives.mlm.transform.0.weight",
    "cls.predictions.transform.dense.bias": "objectives.mlm.transform.0.bias",
    "cls.predictions.transform.LayerNorm.weight": "objectives.mlm.transform.2.weight",
    "cls.predictions.transform.LayerNorm.bias": "objectives.mlm.transform.2.bias",
    "cls.predictions.bias": "objectives.mlm.bias",
}


def config(args: argparse.Namespace, prenorm: bool):
    drop = args.dropout
    return load_run_config(
        "mbert_tiny",
        [*recipe_overrides("mbert_tiny", Path(args.data)), "output_dir=/tmp/unused",
         f"train.max_steps={args.steps}", f"seed={args.seed}", "data.num_workers=0",
         f"model.fusion.transformer.prenorm={str(prenorm).lower()}",
         f"model.fusion.transformer.dropout={drop}",
         f"model.fusion.transformer.attn_dropout={drop}",
         f"model.encoders.text.dropout={drop}", *args.set],
    )  # fmt: skip


def hf_model(cfg, mm):
    """A BertForMaskedLM of the mmptm model's shape, holding its weights."""
    from transformers import BertConfig, BertForMaskedLM

    t = cfg.model.fusion.transformer
    enc = cfg.model.encoders["text"]
    hf = BertForMaskedLM(
        BertConfig(
            vocab_size=mm.encoders["text"].word.num_embeddings,
            hidden_size=cfg.model.width,
            num_hidden_layers=t.layers,
            num_attention_heads=t.heads,
            intermediate_size=int(t.mlp_ratio * cfg.model.width),
            max_position_embeddings=enc.max_positions,
            type_vocab_size=enc.segments,
            hidden_dropout_prob=t.dropout,
            attention_probs_dropout_prob=t.attn_dropout,
            layer_norm_eps=t.layer_norm_eps,
            pad_token_id=0,
            attn_implementation="sdpa",
        )
    )
    ours = mm.state_dict()
    # mmptm's modality-type vector is a constant added to every token, as segment 0 is
    ours["encoders.text.segment.weight"] = (
        ours["encoders.text.segment.weight"] + ours["encoders.text.type_embedding"]
    )
    names = compile_names({**{f"bert.{k}": v for k, v in HF_TO_MMPTM.items()}, **HEAD})
    state = {}
    for name, tensor in hf.state_dict().items():
        src = map_name(names, name)
        if src is not None:
            state[name] = ours[src]
        elif name == "cls.predictions.decoder.weight":
            state[name] = ours["encoders.text.word.weight"]  # tied in both
        elif name == "cls.predictions.decoder.bias":
            state[name] = ours["objectives.mlm.bias"]
        else:
            state[name] = tensor  # buffers (position / token-type ids)
    hf.load_state_dict(state)
    hf.tie_weights()
    return hf


def hf_optimizer(hf, tc):
    """torch AdamW over HF's usual groups, on mmptm's schedule (the same function of the
    step; ``get_cosine_schedule_with_warmup`` would start one step behind, at 0)."""
    no_decay = ("bias", "LayerNorm.weight")
    groups = [
        {"params": [p for n, p in hf.named_parameters() if not n.endswith(no_decay)],
         "weight_decay": tc.weight_decay},
        {"params": [p for n, p in hf.named_parameters() if n.endswith(no_decay)],
         "weight_decay": 0.0},
    ]  # fmt: skip
    opt = torch.optim.AdamW(groups, lr=tc.lr, betas=tuple(tc.betas), eps=tc.eps)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, tc))


def mlm_step(loss: torch.Tensor, params, opt, sched, clip: float) -> None:
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="data/real_parallel")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--every", type=int, default=50, help="steps per printed row")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="key=value for the recipe")
    ap.add_argument("--out", default=None, help="write the per-step curves here (JSON)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:  # on a busy shared machine one thread each is the steadier setting
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = config(args, prenorm=False)
    mm, tok = build_model(cfg)
    hf = hf_model(cfg, mm)
    # folded into HF's segment-0 embedding; trained, it would be a second copy of that
    # vector with its own Adam step, the one difference left between the two models
    mm.encoders["text"].type_embedding.requires_grad_(False)
    torch.manual_seed(args.seed)
    pre_cfg = config(args, prenorm=True)
    pre, _ = build_model(pre_cfg)
    vocab = VocabInfo.from_tokenizer(tok)
    stream = stream_config(
        cfg.data, tok, needs=mm.data_needs(), transforms=data_transforms(cfg.model, vocab),
        seed=cfg.seed,
    )  # fmt: skip
    batches = iter(Loader(stream, 0, DataState()))
    tc = cfg.train
    opts = {
        "mmptm post-LN": (mm, *build_optimizer(mm, tc)),
        "HF BertForMaskedLM": (hf, *hf_optimizer(hf, tc)),
        "mmptm pre-LN (recipe)": (pre, *build_optimizer(pre, tc)),
    }
    curves: dict[str, dict[str, list[float]]] = {k: {"loss": [], "acc": []} for k in opts}
    seconds = dict.fromkeys(opts, 0.0)
    for m, *_ in opts.values():
        m.train()
    for step in range(args.steps):
        batch = move_to(next(batches), "cpu")
        labels = batch["mlm_labels"]
        for name, (model, opt, sched) in opts.items():
            t0 = time.perf_counter()
            if name.startswith("HF"):
                out = model(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"].long()
                )
                sel = labels != -100
                logits = out.logits[sel]
                loss = F.cross_entropy(logits, labels[sel])
                acc = (logits.argmax(-1) == labels[sel]).float().mean()
            else:
                res = model(batch)
                loss, acc = res.loss, res.terms["mlm_acc"]
            mlm_step(loss, model.parameters(), opt, sched, tc.clip_grad_norm)
            seconds[name] += time.perf_counter() - t0
            curves[name]["loss"].append(loss.item())
            curves[name]["acc"].append(float(acc))
        if (step + 1) % args.every == 0:
            row = "  ".join(
                f"{k}: {statistics.mean(c['loss'][-args.every :]):.3f} "
                f"({100 * statistics.mean(c['acc'][-args.every :]):.1f}%)"
                for k, c in curves.items()
            )
            print(f"steps {step + 2 - args.every:>5}-{step + 1:<5} {row}", flush=True)
    a, b = curves["mmptm post-LN"]["loss"], curves["HF BertForMaskedLM"]["loss"]
    gap = max(abs(x - y) for x, y in zip(a, b))
    print(f"max |loss mmptm post-LN - loss HF| over {args.steps} steps: {gap:.2e}")
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "curves": curves}) + "\n")


if __name__ == "__main__":
    main()
