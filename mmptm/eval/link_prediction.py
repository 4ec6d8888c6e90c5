"""Filtered link prediction: MRR and Hits@1/3/10 of the true tail (and head) among all entities.

For a test triple (h, r, t) the tail side scores (h, r, e) for every entity e; every other e
with (h, r, e) a known true triple (train, valid or test) is removed from the candidates
("filtered" setting, Bordes et al. 2013); the head side does the same with (e, r, t).

Ties: the *realistic* rank of PyKEEN (Berrendorf et al. 2020), the mean of the optimistic rank
(1 + #candidates scoring higher) and the pessimistic one (1 + #candidates scoring higher or
equal): a model that gives every entity the same score gets the expected rank of a random
order, (E + 1) / 2, not 1. MRR = mean of 1 / rank; Hits@k = share of ranks ≤ k. Reported per
side and for both sides pooled ("both", as PyKEEN and OpenKE report).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mmptm.models.kge import KGEModel
from mmptm.progress import progress_bar

HITS_AT = (1, 3, 10)


class TrueIndex:
    """The known true completions of (key1, key2) queries, looked up in bulk (sorted keys)."""

    def __init__(self, a: np.ndarray, b: np.ndarray, answer: np.ndarray, n_b: int) -> None:
        keys = a.astype(np.int64) * n_b + b
        order = np.argsort(keys, kind="stable")
        self.keys, self.answers, self.n_b = keys[order], answer[order], n_b

    def pairs(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query row, true answer) for every true answer of each query (a_i, b_i)."""
        q = a.astype(np.int64) * self.n_b + b
        lo = np.searchsorted(self.keys, q, "left")
        counts = np.searchsorted(self.keys, q, "right") - lo
        rows = np.repeat(np.arange(len(q)), counts)
        # positions lo_i, lo_i + 1, ..., lo_i + counts_i − 1 for each query, flattened
        offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        return rows, self.answers[np.repeat(lo, counts) + offsets]


def filtered_ranks(scores_BE: torch.Tensor, true_B: torch.Tensor, rows: np.ndarray,
                   cols: np.ndarray) -> torch.Tensor:  # fmt: skip
    """Realistic ranks [B] of ``true_B`` in each row, with the (rows, cols) entries removed.

    ``scores_BE`` is changed in place (removed entries become −inf); the true entry itself
    may be among the removed ones (it is a known triple) and still counts.
    """
    arange_B = torch.arange(len(true_B), device=scores_BE.device)
    true_s_B = scores_BE[arange_B, true_B].clone()
    scores_BE[torch.as_tensor(rows, device=scores_BE.device),
              torch.as_tensor(cols, device=scores_BE.device)] = float("-inf")  # fmt: skip
    scores_BE[arange_B, true_B] = float("-inf")  # counted apart: itself, once
    higher_B = (scores_BE > true_s_B[:, None]).sum(1)
    equal_B = (scores_BE == true_s_B[:, None]).sum(1)
    optimistic_B = higher_B + 1
    pessimistic_B = higher_B + equal_B + 1
    return (optimistic_B + pessimistic_B).double() / 2


def rank_metrics(ranks: np.ndarray) -> dict[str, float]:
    """MRR, mean rank and Hits@1/3/10 of realistic ranks."""
    if not len(ranks):
        return {"mrr": float("nan"), "mean_rank": float("nan"), "count": 0}
    out = {"mrr": float(np.mean(1.0 / ranks)), "mean_rank": float(np.mean(ranks))}
    out.update({f"hits@{k}": float(np.mean(ranks <= k)) for k in HITS_AT})
    out["count"] = len(ranks)
    return out


def named_relations(metrics: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """``metrics`` with its ``by_relation`` keyed by relation name instead of id."""
    if "by_relation" not in metrics:
        return metrics
    return {**metrics, "by_relation": {names[r]: m for r, m in metrics["by_relation"].items()}}


def format_link_prediction(metrics: dict[str, Any], split: str) -> str:
    """Lines of :func:`link_prediction`'s (or :func:`side_metrics`') result: one per side,
    then one per relation (both sides pooled) when it has ``by_relation``."""

    def line(name: str, m: dict[str, float]) -> str:
        if not m["count"]:
            return f"{name}: no queries"
        return (
            f"{name}: MRR {m['mrr']:.4f}  Hits@1 {m['hits@1']:.4f}  Hits@3 {m['hits@3']:.4f}  "
            f"Hits@10 {m['hits@10']:.4f}  ({m['count']} queries)"
        )

    lines = [line(f"{split} {side:>4}", metrics[side]) for side in ("tail", "head", "both")]
    by_relation = metrics.get("by_relation", {})
    width = max((len(str(r)) for r in by_relation), default=0)
    lines += [line(f"  {r!s:<{width}}", m) for r, m in by_relation.items()]
    return "\n".join(lines)


#: scores [B,E] of every entity as the tail ("tail") or head ("head") of triples [B,3]
ScoreFn = Callable[[str, np.ndarray], torch.Tensor]


@torch.no_grad()
def side_ranks(score_fn: ScoreFn, triples: np.ndarray, known: np.ndarray, n_relations: int, *,
               batch_size: int, progress: bool = False) -> dict[str, np.ndarray]:  # fmt: skip
    """Filtered realistic ranks ``{"tail": [N], "head": [N]}`` of ``triples [N,3]`` under any
    scorer (a trained model, or a baseline that learns nothing), filtered by ``known [M,3]``."""
    tails = TrueIndex(known[:, 0], known[:, 1], known[:, 2], n_relations)  # (h, r) → tails
    heads = TrueIndex(known[:, 2], known[:, 1], known[:, 0], n_relations)  # (t, r) → heads
    ranks: dict[str, list[np.ndarray]] = {"tail": [], "head": []}
    bar = progress_bar(total=2 * len(triples), desc="link prediction", unit="query",
                       enabled=progress)  # fmt: skip
    for side in ("tail", "head"):
        index, key, true_col = (tails, 0, 2) if side == "tail" else (heads, 2, 0)
        for start in range(0, len(triples), batch_size):
            batch = triples[start : start + batch_size]
            scores_BE = score_fn(side, batch)
            rows, cols = index.pairs(batch[:, key], batch[:, 1])
            true = torch.as_tensor(batch[:, true_col], device=scores_BE.device)
            ranks[side].append(filtered_ranks(scores_BE, true, rows, cols).cpu().numpy())
            bar.update(len(batch))
    bar.close()
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in ranks.items()}


def side_metrics(ranks: dict[str, np.ndarray], relations: np.ndarray | None = None
                 ) -> dict[str, Any]:  # fmt: skip
    """``{"tail", "head", "both"}`` metrics of :func:`side_ranks`; with the test triples'
    ``relations [N]``, also ``"by_relation": {relation id: metrics of both sides}``."""
    tail, head = ranks["tail"], ranks["head"]
    out: dict[str, Any] = {"tail": rank_metrics(tail), "head": rank_metrics(head),
                           "both": rank_metrics(np.concatenate([tail, head]))}  # fmt: skip
    if relations is not None:
        out["by_relation"] = {
            int(r): rank_metrics(np.concatenate([tail[relations == r], head[relations == r]]))
            for r in np.unique(relations)
        }
    return out


def model_scores(model: KGEModel) -> ScoreFn:
    """A trained model's :data:`ScoreFn`: its queries matched against the whole entity table."""
    C = 1 << 16  # entities matched per call

    def score(side: str, batch: np.ndarray) -> torch.Tensor:
        r_BD = model.relations[torch.as_tensor(batch[:, 1]).to(model.device)]
        if side == "tail":
            q_BD = model.score.tail_query(model.gather(torch.as_tensor(batch[:, 0])), r_BD)
        else:
            q_BD = model.score.head_query(r_BD, model.gather(torch.as_tensor(batch[:, 2])))
        return torch.cat([model.score.match_all(q_BD, e_CD)
                          for _, e_CD in model.entity_chunks(C)], dim=1)  # fmt: skip

    return score


@torch.no_grad()
def link_prediction(
    model: KGEModel,
    triples: np.ndarray,
    known: np.ndarray,
    *,
    batch_size: int = 0,
    max_triples: int = 0,
    progress: bool = False,
    per_relation: bool = False,
) -> dict[str, Any]:
    """Filtered ranks of ``triples [N,3]`` (h, r, t), filtered by ``known [M,3]``.

    Returns ``{"tail": metrics, "head": metrics, "both": metrics}`` (see :func:`rank_metrics`),
    and ``"by_relation"`` with ``per_relation`` (:func:`side_metrics`).
    ``batch_size``: queries scored at once (default: as many as keep [B,E] scores ≤ 64 M).
    ``max_triples``: evaluate the first N only (0 = all; for quick checks during training).
    """
    if max_triples:
        triples = triples[:max_triples]
    B = batch_size or max(1, min(1024, (1 << 26) // len(model.entities)))
    ranks = side_ranks(model_scores(model), triples, known, len(model.relations), batch_size=B,
                       progress=progress)  # fmt: skip
    return side_metrics(ranks, triples[:, 1] if per_relation else None)
