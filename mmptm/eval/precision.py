"""Precision@k of ranked lists against sets of relevant items (several relevant per query).

Retrieval's R@k (:mod:`~mmptm.eval.retrieval`) asks where one true partner ranks; a query
such as "a large red circle" has many right answers (every image holding such a circle), so
it is scored by how much of what comes first is right.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from typing import Any


def precision_at_k(
    ranked: Sequence[Sequence[Hashable]],
    relevant: Sequence[Collection[Hashable]],
    k: int = 3,
    *,
    min_relevant: int | None = None,
    n_items: int | None = None,
) -> dict[str, Any]:
    """P@k: per query the share of its first ``k`` results that are relevant, averaged.

    ``ranked[q]`` lists query q's results best first (fewer than ``k`` count as misses:
    the share is always out of ``k``); ``relevant[q]`` holds its relevant items. Only queries
    with at least ``min_relevant`` relevant items count (default ``k``: every query could
    score 1); the others are left out, not scored 0.

    Returns ``precision`` (the mean over counted queries; None when none counts),
    ``queries`` (how many counted), ``skipped`` (how many were left out), ``per_query``
    (each query's P@k, None where left out) and, given ``n_items`` (the collection's size),
    ``chance``: the mean over counted queries of relevant / n_items, what a random ranking
    scores in expectation.
    """
    if len(ranked) != len(relevant):
        raise ValueError(f"{len(ranked)} rankings but {len(relevant)} relevant sets")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    need = k if min_relevant is None else min_relevant
    per_query: list[float | None] = []
    chance: list[float] = []
    for results, good in zip(ranked, relevant):
        if len(good) < need:
            per_query.append(None)
            continue
        top = list(results)[:k]
        if len(set(top)) != len(top):
            raise ValueError(f"a ranking repeats an item in its first {k}: {top}")
        per_query.append(sum(r in good for r in top) / k)
        if n_items is not None:
            chance.append(min(len(good) / n_items, 1.0))
    scored = [p for p in per_query if p is not None]
    out: dict[str, Any] = {
        "precision": sum(scored) / len(scored) if scored else None,
        "k": k,
        "queries": len(scored),
        "skipped": len(per_query) - len(scored),
        "per_query": per_query,
    }
    if n_items is not None:
        out["chance"] = sum(chance) / len(chance) if chance else None
    return out
