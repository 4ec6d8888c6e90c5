"""What the task-head evaluations share: a fine-tuned checkpoint with its head, and the
batches of a split (``evaluate_vqa``, ``evaluate_refexp``, ``evaluate_nlvr2``, ``evaluate_vcr``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from mmptm.batch import END, Batch, BatchTransform, move_to
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel

H = TypeVar("H")


def load_head(
    path: str, kind: type[H], objective: str, recipe: str, overrides: Sequence[str] = ()
) -> tuple[PretrainModel, H, Any, Any]:
    """(model in eval mode, its ``kind`` objective, tokenizer, config) of a checkpoint; a
    one-line error naming ``objective`` and the fine-tuning ``recipe`` when it has none."""
    model, tokenizer, cfg = load_pretrained(path, overrides)
    head = next((o for o in model.objectives.values() if isinstance(o, kind)), None)
    if head is None:
        raise ValueError(
            f"the model has no {objective} objective (fine-tune one: mmptm finetune {recipe} "
            "init=RUN)"
        )
    return model.eval(), head, tokenizer, cfg


def split_batches(
    model: PretrainModel,
    tokenizer: Any,
    cfg: Any,
    *,
    split: str,
    shards: str | None,
    device: str,
    prepare: Callable[[Batch], Batch] | None = None,
    transforms: Sequence[BatchTransform] = (),
) -> Iterator[Batch]:
    """One pass over ``split`` (or ``shards``) as the run's config reads it, each batch
    ``prepare``d (on the CPU) and moved to ``device``; ``model`` is moved there too.
    ``transforms`` (data sides) run among the plug-ins' batch stages by priority: a data side
    that must come before one of them (the text pairs' joining) goes here, not in ``prepare``."""
    model.to(device)
    stream = stream_config(
        cfg.data, tokenizer, split=split, shards=shards, needs=model.data_needs(),
        transforms=transforms, seed=cfg.seed,
    )  # fmt: skip
    for batch in single_pass(stream):
        if END in batch:
            continue
        yield move_to(prepare(batch) if prepare else batch, device)


__all__ = ["load_head", "split_batches"]
