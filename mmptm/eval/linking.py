"""Entity linking accuracy of a KnowBERT run (``fusion: knowbert``) on candidate shards.

Every candidate span of the shards (``mmptm data candidates``) whose gold entity is among its
candidates is linked by the last KAR's linker (argmax of its scores) and, as the baseline,
by the prior alone (argmax p(e | alias)); the texts are read unmasked. Spans cut off by
``max_len`` are not counted (the ``candidates`` plug-in drops them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mmptm.batch import END, move_to
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.linking import prior_accuracy


@torch.no_grad()
def linking_accuracy(
    model: PretrainModel, cfg: Any, tokenizer: Any, shards: str, device: str = "cpu"
) -> dict[str, Any]:
    """``acc`` (the last KAR's linker) and ``prior_acc`` over ``spans`` gold-bearing spans,
    and ``per_layer`` accuracy of each KAR (None where no span was linked)."""
    if not hasattr(model.fusion, "kar"):
        raise ValueError("the run links no entities: its fusion is not knowbert")
    model.eval().to(device)
    stream = stream_config(
        cfg.data, tokenizer, split="test", shards=shards, needs=model.data_needs(), seed=cfg.seed
    )
    right: dict[int, int] = {}
    prior_right = n = 0
    for batch in single_pass(stream):
        if END in batch:
            continue
        batch = move_to(batch, device)
        link = model.fuse(batch).link  # type: ignore[attr-defined]
        gold_BM = batch["candidate_gold"]
        on_BM = gold_BM >= 0
        for layer, link_BMC in link.items():
            hit_BM = (link_BMC.argmax(-1) == gold_BM) & on_BM & torch.isfinite(link_BMC).any(-1)
            right[layer] = right.get(layer, 0) + int(hit_BM.sum())
        got, spans = prior_accuracy(batch["candidate_priors"], batch["candidate_ids"], gold_BM)
        prior_right += got
        n += spans
    per_layer = {layer: (r / n if n else None) for layer, r in right.items()}
    last = per_layer[max(per_layer)] if per_layer else None
    return {"spans": n, "acc": last, "prior_acc": prior_right / n if n else None,
            "per_layer": per_layer}  # fmt: skip


def evaluate_linking(
    run: str,
    shards: str | None = None,
    *,
    overrides: Sequence[str] = (),
    device: str = "cpu",
    model: tuple[PretrainModel, Any, Any] | None = None,
) -> dict[str, Any]:
    """:func:`linking_accuracy` of a run (directory or checkpoint) on ``shards`` (default: its
    ``data.test``). ``model``: an already loaded (model, tokenizer, cfg)."""
    net, tokenizer, cfg = model or load_pretrained(run, overrides)
    spec = shards or cfg.data.test
    if not spec:
        raise ValueError("no shards to link: give shards or set data.test")
    return linking_accuracy(net, cfg, tokenizer, spec, device)
