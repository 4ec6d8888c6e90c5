"""Zero-shot cross-lingual transfer, as XTREME reports it: a run fine-tuned on one language
(English) scored on every language's set, one column per language and their average.

One evaluator for every fine-tuning head, found by the head the run has:

| head | tasks | metrics (the first is the headline) |
|---|---|---|
| ``classification`` | XNLI, PAWS-X | ``acc`` |
| ``token_tagging``, BIO tags | WikiANN | ``f1`` (seqeval's span F1), ``p``, ``r``, ``acc`` |
| ``token_tagging``, other tags | UD-POS | ``acc`` |
| ``extractive_qa`` | XQuAD, MLQA, TyDiQA-GoldP | ``f1``, ``em`` (SQuAD's script) |
| ``entity_typing`` / ``relation_classification`` | Open Entity, TACRED | as ``mmptm eval spans`` |

The sets are named shard specs (default: the run's ``data.eval``, one per language in the
multilingual recipes), or one pattern with ``{lang}`` filled per language. ``avg`` is the
mean over all the sets of each score (English included, as XTREME's table).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mmptm.eval.classification import accuracy
from mmptm.eval.qa import evaluate_qa_set, qa_head
from mmptm.eval.spans import evaluate_span_set, span_head
from mmptm.eval.tagging import evaluate_tagging_set, tagging_head
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.classification import Classification

log = logging.getLogger(__name__)
#: a loaded run: (model, tokenizer, config)
Loaded = tuple[PretrainModel, Any, Any]


def task_of(model: PretrainModel) -> tuple[str, str]:
    """(head type, headline metric) of a fine-tuned model; an error without a task head."""
    tagger = tagging_head(model)
    if tagger is not None:
        return "token_tagging", "f1" if tagger.scheme == "bio" else "acc"
    qa = qa_head(model)
    if qa is not None:
        return "extractive_qa", "f1"
    span = span_head(model)
    if span is not None:
        kind = span[1].cfg.type
        return kind, "micro_f1" if kind == "entity_typing" else "f1"
    if any(isinstance(o, Classification) for o in model.objectives.values()):
        return "classification", "acc"
    raise ValueError(
        "the run has no task head (classification, token_tagging, extractive_qa, "
        "entity_typing, relation_classification): fine-tune one first"
    )


def sequence_head(model: PretrainModel) -> bool:
    """Whether the model tags tokens or extracts answers (what ``mmptm finetune`` scores
    through this module)."""
    return tagging_head(model) is not None or qa_head(model) is not None


@torch.no_grad()
def evaluate_set(
    model: PretrainModel, cfg: Any, tokenizer: Any, shards: str, device: str = "cpu"
) -> dict[str, Any]:
    """The scores of the model's task head on one shard spec."""
    kind, _ = task_of(model)
    model.eval().to(device)
    if kind == "token_tagging":
        return evaluate_tagging_set(model, cfg, tokenizer, shards, device)
    if kind == "extractive_qa":
        return evaluate_qa_set(model, cfg, tokenizer, shards, device)
    if kind == "classification":
        return {"acc": accuracy(model, cfg, tokenizer, shards, device)}
    return evaluate_span_set(model, cfg, tokenizer, shards, group_by=(), device=device)["overall"]


def language_sets(pattern: str, languages: Sequence[str]) -> dict[str, str]:
    """One shard spec per language from a pattern with ``{lang}``."""
    if "{lang}" not in pattern:
        raise ValueError(f"--pattern {pattern!r} needs a {{lang}} placeholder")
    if not languages:
        raise ValueError("--pattern needs --languages (e.g. en,de,fr)")
    return {lang: pattern.replace("{lang}", lang) for lang in languages}


def _scores(metrics: Mapping[str, Any]) -> list[str]:
    """The keys averaged over languages: the float-valued ones (counts are integers)."""
    return [k for k, v in metrics.items() if isinstance(v, float)]


def evaluate_transfer(
    run: str = "",
    sets: Mapping[str, str] | None = None,
    *,
    overrides: Sequence[str] = (),
    device: str = "cpu",
    model: Loaded | None = None,
) -> dict[str, Any]:
    """Scores of a fine-tuned run (directory or checkpoint; ``model``: already loaded) on each
    named set (default: its ``data.eval``): ``{"task", "metric", "sets": {name: scores},
    "avg": {score: mean over the sets}}``."""
    net, tokenizer, cfg = model or load_pretrained(run, overrides)
    sets = dict(sets or cfg.data.eval)
    if not sets:
        raise ValueError("no evaluation sets: give --set LANG=SHARDS, --pattern with "
                         "--languages, or set data.eval (one set per language)")  # fmt: skip
    kind, metric = task_of(net)
    per_set = {}
    for name, spec in sets.items():
        per_set[name] = evaluate_set(net, cfg, tokenizer, spec, device)
        log.info("%s: %s %.4f", name, metric, per_set[name].get(metric, float("nan")))
    keys = [k for k in _scores(next(iter(per_set.values())))
            if all(isinstance(s.get(k), float) for s in per_set.values())]  # fmt: skip
    avg = {k: sum(s[k] for s in per_set.values()) / len(per_set) for k in keys}
    return {"task": kind, "metric": metric, "sets": per_set, "avg": avg}


def format_transfer(result: Mapping[str, Any], title: str = "") -> str:
    """A table: one row per score (the headline first) and ``n``, a column per set and avg."""
    sets = result["sets"]
    names = [*sets, "avg"]
    keys = sorted(result["avg"], key=lambda k: k != result["metric"])
    lines = [title] if title else []
    lines.append(f"{'':<10}" + "".join(f"{n:>9}" for n in names))
    for k in keys:
        cells = [sets[n][k] for n in sets] + [result["avg"][k]]
        lines.append(f"{k:<10}" + "".join(f"{100 * v:>8.1f}%" for v in cells))
    if all("n" in s for s in sets.values()):
        lines.append(f"{'n':<10}" + "".join(f"{sets[n]['n']:>9}" for n in sets))
    return "\n".join(lines)


__all__ = [
    "evaluate_set",
    "evaluate_transfer",
    "format_transfer",
    "language_sets",
    "sequence_head",
    "task_of",
]
