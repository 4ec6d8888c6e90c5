"""Evaluation of the span task heads (entity typing, relation classification) on shards.

A fine-tuned run's ``entity_typing`` or ``relation_classification`` head predicts every
sample of a shard spec (as ``mmptm data typing`` / ``relations`` write them); the metrics are
the head's (``mmptm.objectives.spans``: micro / loose-macro F1 for typing, accuracy and
TACRED's F1 without ``no_relation`` for relations), overall and per value of each
``group_by`` json field (``facts``: text / graph), read from the shards by sample key. Labels
the run's vocabulary lacks are counted (``unknown_labels``) and scored as missed.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mmptm.batch import END, KEY, move_to
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.spans import SpanTask


def span_head(model: PretrainModel) -> tuple[str, SpanTask] | None:
    """The model's span task head (name, objective), or None."""
    return next(((n, o) for n, o in model.objectives.items() if isinstance(o, SpanTask)), None)


def _groups(shards: str, fields: Sequence[str]) -> dict[str, dict[str, str]]:
    """Per sample key: the string value of each ``fields`` entry of its json."""
    out: dict[str, dict[str, str]] = {}
    if not fields:
        return out
    for s in tar_samples(expand_shards(shards), SkipCounter()):
        try:
            meta = json.loads(s.get("json", b"{}"))
        except ValueError:
            continue  # the stream skips and counts it too
        out[s[KEY]] = {f: str(meta[f]) for f in fields if isinstance(meta, dict) and f in meta}
    return out


@torch.no_grad()
def predict_spans(
    model: PretrainModel, cfg: Any, tokenizer: Any, shards: str, device: str = "cpu"
) -> tuple[SpanTask, list[str], torch.Tensor, torch.Tensor, torch.Tensor]:
    """The head, the sample keys and its predictions, gold labels and unknown-label counts."""
    found = span_head(model)
    if found is None:
        raise ValueError(
            "the run has no span task head (entity_typing or relation_classification): "
            "fine-tune one first"
        )
    _, head = found
    model.eval().to(device)
    stream = stream_config(
        cfg.data, tokenizer, split="test", shards=shards, needs=model.data_needs(), seed=cfg.seed
    )
    keys, preds, golds, unknown = [], [], [], []
    for batch in single_pass(stream):
        if END in batch:
            continue
        keys += list(batch[KEY])
        batch = move_to(batch, device)
        preds.append(head.predict(head.logits(model.fuse(batch), batch)).cpu())
        golds.append(head.gold(batch).cpu())
        unknown.append(batch["label_unknown"].cpu())
    if not keys:
        raise ValueError(f"{shards}: no samples")
    return head, keys, torch.cat(preds), torch.cat(golds), torch.cat(unknown)


def evaluate_span_set(
    model: PretrainModel,
    cfg: Any,
    tokenizer: Any,
    shards: str,
    *,
    group_by: Sequence[str] = ("facts",),
    device: str = "cpu",
) -> dict[str, Any]:
    """Metrics of the model's span head on ``shards``: ``overall`` and ``by_<field>``."""
    head, keys, pred, gold, unknown = predict_spans(model, cfg, tokenizer, shards, device)
    result: dict[str, Any] = {
        "task": head.cfg.type,
        "overall": head.scores(pred, gold, unknown),
        "unknown_labels": int((unknown > 0).sum()),
    }
    groups = _groups(shards, group_by)
    for name in group_by:
        rows: dict[str, list[int]] = defaultdict(list)
        for i, k in enumerate(keys):
            if name in groups.get(k, {}):
                rows[groups[k][name]].append(i)
        if rows:
            result[f"by_{name}"] = {
                v: head.scores(pred[ix], gold[ix], unknown[ix])
                for v, ix in ((v, torch.tensor(ix)) for v, ix in sorted(rows.items()))
            }
    return result


def evaluate_spans(
    run: str,
    sets: Mapping[str, str] | None = None,
    *,
    group_by: Sequence[str] = ("facts",),
    overrides: Sequence[str] = (),
    device: str = "cpu",
    model: tuple[PretrainModel, Any, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Span-task metrics of a fine-tuned run (directory or checkpoint) per named shard spec
    (default: its config's ``data.eval``). ``model``: an already loaded (model, tokenizer, cfg)."""
    net, tokenizer, cfg = model or load_pretrained(run, overrides)
    sets = sets or cfg.data.eval
    if not sets:
        raise ValueError("no evaluation sets: give --shards or set data.eval (name: shards)")
    return {
        name: evaluate_span_set(net, cfg, tokenizer, spec, group_by=group_by, device=device)
        for name, spec in sets.items()
    }


def format_spans(results: Mapping[str, Mapping[str, Any]]) -> str:
    """A table: one row per set (and per group value), the head's metrics as columns."""
    first = next(iter(results.values()))
    cols = [c for c in first["overall"] if c != "n"]
    lines = [f"{'':<28}" + "".join(f"{c:>10}" for c in cols) + f"{'n':>7}"]

    def row(name: str, m: Mapping[str, float]) -> None:
        cells = "".join(f"{100 * m[c]:>9.1f}%" for c in cols)
        lines.append(f"{name:<28}{cells}{m['n']:>7}")

    for name, r in results.items():
        row(name, r["overall"])
        for key, groups in r.items():
            if key.startswith("by_"):
                for value, m in groups.items():
                    row(f"  {key[3:]}={value}", m)
    return "\n".join(lines)


__all__ = ["evaluate_span_set", "evaluate_spans", "format_spans", "predict_spans", "span_head"]
