"""Evaluation of the pair-of-images head (``image_pair``, NLVR2): accuracy and consistency.

Consistency is NLVR2's second metric (Suhr et al. 2019, its ``metrics.py``): the share of the
unique sentences whose every example is judged right. An example's ``identifier`` is
``split-setid-pairid-sentenceid``; the official script blanks its third part (the image pair)
and groups by what is left, so a group is one sentence of one set, over every image pair it
was written for. It is reported when every identifier has those four parts (NLVR2's, as
``mmptm data nlvr2`` keeps them in ``json.identifier``); toyworld's pairs (``split-i``) have
no sentence groups and get accuracy alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from mmptm.batch import KEY
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.eval.heads import load_head, split_batches
from mmptm.objectives.nlvr2 import ImagePairHead, PairRows


def sentence_group(identifier: str) -> str | None:
    """The consistency group of an NLVR2 identifier (``split-setid-pairid-sentenceid``, the
    pair id blanked as the official script does), or None when it lacks the four parts."""
    parts = identifier.split("-")
    if len(parts) != 4:
        return None
    parts[2] = ""
    return "-".join(parts)


def consistency(judged: Iterable[tuple[str, bool]]) -> float | None:
    """Share (%) of the sentence groups whose every example is right (``judged``: pairs of
    identifier and whether it was judged right), or None if an identifier is not NLVR2's."""
    groups: dict[str, bool] = {}
    for identifier, ok in judged:
        group = sentence_group(identifier)
        if group is None:
            return None
        groups[group] = groups.get(group, True) and ok
    return 100.0 * sum(groups.values()) / len(groups) if groups else None


def identifiers(spec: str) -> dict[str, str]:
    """Sample key → ``json.identifier`` of the samples of a shard spec (the key itself when
    a sample's json has none)."""
    out = {}
    for sample in tar_samples(expand_shards(spec), SkipCounter()):
        try:
            out[sample[KEY]] = str(json.loads(sample["json"])["identifier"])
        except (KeyError, ValueError, TypeError):
            out[sample[KEY]] = sample[KEY]
    return out


@torch.no_grad()
def evaluate_nlvr2(
    path: str,
    *,
    split: str = "test",
    shards: str | None = None,
    overrides: Sequence[str] = (),
    device: str = "cpu",
) -> dict[str, Any]:
    """Accuracy (%) of a fine-tuned checkpoint's true/false judgements: ``accuracy``, ``n``,
    and NLVR2's ``consistency`` (%) with its number of sentence ``groups`` when the samples
    carry NLVR2's identifiers (module doc)."""
    model, head, tokenizer, cfg = load_head(path, ImagePairHead, "image_pair", "nlvr2", overrides)
    rows = PairRows()
    keys: list[list[str]] = []

    def prepare(batch: dict) -> dict:
        keys.append(list(batch[KEY]))  # one key a pair: PairRows repeats them per row
        return rows(batch, torch.Generator())

    right: list[tuple[str, bool]] = []  # (sample key, judged right) per pair
    for batch in split_batches(
        model, tokenizer, cfg, split=split, shards=shards, device=device, prepare=prepare
    ):
        pred_B = head.logits(model.fuse(batch)).argmax(-1)
        right += zip(keys[-1], (pred_B == batch["pair_labels"]).tolist())
    n = len(right)
    result: dict[str, Any] = {"accuracy": 100.0 * sum(ok for _, ok in right) / max(n, 1),
                              "n": float(n)}  # fmt: skip
    names = identifiers(shards or getattr(cfg.data, split))
    judged = [(names.get(k, k), ok) for k, ok in right]
    score = consistency(judged)
    if score is not None:
        result["consistency"] = score
        result["groups"] = float(len({sentence_group(i) for i, _ in judged}))
    return result


__all__ = ["consistency", "evaluate_nlvr2", "identifiers", "sentence_group"]
