"""``mmptm pretrain`` and ``mmptm finetune``: train from a recipe (a name or a YAML file)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RECIPE_HELP = "a recipe name (`mmptm recipes` lists them) or a YAML file"


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm pretrain`` and ``mmptm finetune``."""
    pt = sub.add_parser("pretrain", help="pre-train from a recipe")
    pt.add_argument("config", metavar="recipe", help=RECIPE_HELP)
    pt.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    pt.set_defaults(fn=_pretrain)

    ft = sub.add_parser("finetune", help="fine-tune a checkpoint (init=...) on a task")
    ft.add_argument("config", metavar="recipe", help=RECIPE_HELP)
    ft.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    ft.set_defaults(fn=_finetune)


def _pretrain(args: argparse.Namespace) -> int:
    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import pretrain

    cfg = load_run_config(args.config, args.overrides)
    last = pretrain(cfg)
    print(json.dumps(last))
    return 0


def _finetune(args: argparse.Namespace) -> int:
    from mmptm.eval.classification import evaluate_sets, format_accuracy
    from mmptm.eval.spans import evaluate_spans, format_spans, span_head
    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import Trainer

    cfg = load_run_config(args.config, args.overrides)
    if not cfg.init:
        raise ValueError("finetune needs init=<checkpoint or run dir> (init_mode=architecture "
                         "trains the same shape from scratch)")  # fmt: skip
    trainer = Trainer(cfg)
    trainer.fit()
    if trainer.dist.main and cfg.data.eval and span_head(trainer.model):
        spans = evaluate_spans("", model=(trainer.model, trainer.tokenizer, cfg))
        (Path(cfg.output_dir) / "eval.json").write_text(json.dumps(spans, indent=2) + "\n")
        print(format_spans(spans))
    elif trainer.dist.main and cfg.data.eval:
        result = evaluate_sets(trainer.model, cfg, trainer.tokenizer, cfg.data.eval)
        (Path(cfg.output_dir) / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        print(format_accuracy({Path(cfg.output_dir).name: result}))
    return 0
