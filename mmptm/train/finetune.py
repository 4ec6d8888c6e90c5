"""Fine-tuning: train a task recipe from an earlier run (``init=``), then evaluate its sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmptm.eval.classification import evaluate_sets, format_accuracy
from mmptm.eval.spans import evaluate_spans, format_spans, span_head
from mmptm.eval.transfer import evaluate_transfer, format_transfer, sequence_head
from mmptm.recipe import RunConfig
from mmptm.train.trainer import Trainer


def finetune(cfg: RunConfig, *, show: bool = True) -> dict[str, Any]:
    """Train ``cfg`` from its ``init`` run, then score ``data.eval``'s sets (accuracy, the
    span metrics of a span head, a tagger's or QA head's scores per set and their average)
    into ``<output_dir>/eval.json``. Returns ``{"last": the last logged metrics, "eval": the
    scores}`` (``eval`` empty without sets, and on ranks but the first); ``show`` prints the
    scores' table."""
    if not cfg.init:
        raise ValueError("finetune needs init=<checkpoint or run dir> (init_mode=architecture "
                         "trains the same shape from scratch)")  # fmt: skip
    trainer = Trainer(cfg)
    last = trainer.fit()
    result: dict[str, Any] = {}
    if trainer.dist.main and cfg.data.eval:
        if span_head(trainer.model):
            result = evaluate_spans("", model=(trainer.model, trainer.tokenizer, cfg))
            table = format_spans(result)
        elif sequence_head(trainer.model):  # tagging, QA: per language and the average
            result = evaluate_transfer(model=(trainer.model, trainer.tokenizer, cfg))
            table = format_transfer(result)
        else:
            result = evaluate_sets(trainer.model, cfg, trainer.tokenizer, cfg.data.eval)
            table = format_accuracy({Path(cfg.output_dir).name: result})
        (Path(cfg.output_dir) / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        if show:
            print(table)
    return {"last": last, "eval": result}


__all__ = ["finetune"]
