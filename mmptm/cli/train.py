"""``mmptm pretrain`` and ``mmptm finetune``: train from a recipe (a name or a YAML file)."""

from __future__ import annotations

import argparse
import json

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
    from mmptm.recipe import load_run_config
    from mmptm.train.finetune import finetune

    finetune(load_run_config(args.config, args.overrides))
    return 0
