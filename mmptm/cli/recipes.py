"""``mmptm recipes``: every recipe on the search path, its parts and what it reproduces."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mmptm.recipe import RunConfig


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm recipes``."""
    rc = sub.add_parser(
        "recipes",
        help="list the recipes: family, modalities, parts, parameters, what they reproduce",
        description="List the recipes mmptm finds by name: the user's folders "
        "(MMPTM_RECIPE_PATH) first, then those that ship with it.",
    )
    rc.add_argument("--modality", help="only the recipes that read this modality (e.g. audio)")
    rc.add_argument("--json", action="store_true", help="a JSON list of one object per recipe")
    rc.set_defaults(fn=_recipes)


def _recipes(args: argparse.Namespace) -> int:
    from mmptm.recipe import list_recipes

    rows = [describe(name) for name in list_recipes(args.modality)]
    rows.sort(key=lambda r: (r["kind"] != "pretrain", r["family"], r["name"]))
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        print(format_table(rows))
    return 0


def describe(name: str) -> dict[str, Any]:
    """One recipe as plain data: what ``mmptm recipes --json`` prints for it."""
    from mmptm.recipe import load_recipe, recipe_kind, recipe_modalities, recipe_path

    cfg = load_recipe(name)
    own = bool(cfg.model.encoders)  # else its model is the init run's
    count, note = parameters(cfg)
    return {
        "name": name,
        "kind": recipe_kind(name),
        "family": cfg.info.family,
        "modalities": recipe_modalities(cfg),
        "fusion": cfg.model.fusion.type if own else None,
        "objectives": {key: o.type for key, o in cfg.model.objectives.items()},
        "parameters": count,
        "parameters_note": note,
        "reproduces": [vars(r) for r in cfg.info.reproduces],
        "summary": cfg.info.summary,
        "init": cfg.init,
        "path": str(recipe_path(name)),
    }


def parameters(cfg: RunConfig) -> tuple[int | None, str]:
    """The number of parameters of the recipe's model and a note: "" when counted with the
    recipe's tokenizer (or a model that reads no text), the vocabulary size assumed when the
    tokenizer is not there yet (``info.vocab_size``), or why there is no count."""
    from mmptm.models.load import count_parameters
    from mmptm.registry import ENCODERS

    if not cfg.model.encoders:
        return None, f"the model of its init run ({cfg.init or 'init='}) with this task's head"
    reads_text = any(ENCODERS.get(c.type).modality == "text" for c in cfg.model.encoders.values())
    vocab, note = None, ""
    if not reads_text:
        vocab = 0  # no text encoder: the tokenizer changes nothing
    elif not (cfg.data.tokenizer and Path(cfg.data.tokenizer).is_file()):
        if not cfg.info.vocab_size:
            return None, f"needs its tokenizer ({cfg.data.tokenizer or 'data.tokenizer'})"
        vocab, note = cfg.info.vocab_size, f"with a vocabulary of {cfg.info.vocab_size}"
    try:
        return count_parameters(cfg, vocab), note
    except (OSError, ValueError) as e:  # a file a part reads: answers, codebook, entities
        return None, "needs " + " ".join(str(e).split())


def _count(row: dict[str, Any]) -> str:
    n = row["parameters"]
    if n is None:
        return "—"
    text = f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.1f}k"
    return ("≈" if row["parameters_note"] else "") + text


def format_table(rows: list[dict[str, Any]]) -> str:
    """The recipes as a text table, with notes on the counts it could not make."""
    from mmptm.recipe import Reference

    head = ["recipe", "kind", "family", "modalities", "fusion", "objectives", "params",
            "reproduces"]  # fmt: skip
    cells = [
        [
            r["name"],
            r["kind"],
            r["family"],
            ",".join(r["modalities"]),
            r["fusion"] or "(init run's)",
            ",".join(dict.fromkeys(r["objectives"].values())),
            _count(r),
            "; ".join(str(Reference(**x)) for x in r["reproduces"]) or "—",
        ]
        for r in rows
    ]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *cells]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("≈: counted with the vocabulary size the recipe assumes (info.vocab_size) until "
                 "its tokenizer exists")  # fmt: skip
    lines += [f"{r['name']}: {r['parameters_note']}" for r in rows if r["parameters"] is None]
    return "\n".join(lines)
