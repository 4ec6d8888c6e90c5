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


@torch.no_grad()
def link_prediction(
    model: KGEModel,
    triples: np.ndarray,
    known: np.ndarray,
    *,
    batch_size: int = 0,
    max_triples: int = 0,
    progress: bool = False,
) -> dict[str, dict[str, float]]:
    """Filtered ranks of ``triples [N,3]`` (h, r, t), filtered by ``known [M,3]``.

    Returns ``{"tail": metrics, "head": metrics, "both": metrics}`` (see :func:`rank_metrics`).
    ``batch_size``: queries scored at once (default: as many as keep [B,E] scores ≤ 64 M).
    ``max_triples``: evaluate the first N only (0 = all; for quick checks during training).
    """
    if max_triples:
        triples = triples[:max_triples]
    n_ent = len(model.entities)
    B = batch_size or max(1, min(1024, (1 << 26) // n_ent))
    C = 1 << 16  # entities matched per call
    n_rel = len(model.relations)
    tails = TrueIndex(known[:, 0], known[:, 1], known[:, 2], n_rel)  # (h, r) → true tails
    heads = TrueIndex(known[:, 2], known[:, 1], known[:, 0], n_rel)  # (t, r) → true heads
    ranks: dict[str, list[np.ndarray]] = {"tail": [], "head": []}
    bar = progress_bar(total=2 * len(triples), desc="link prediction", unit="query",
                       enabled=progress)  # fmt: skip
    rel = model.relations
    for side in ("tail", "head"):
        for start in range(0, len(triples), B):
            batch = triples[start : start + B]
            h, r, t = (torch.as_tensor(batch[:, i]) for i in range(3))
            r_BD = rel[r.to(model.device)]
            if side == "tail":
                q_BD = model.score.tail_query(model.gather(h), r_BD)
                rows, cols = tails.pairs(batch[:, 0], batch[:, 1])
                true = t
            else:
                q_BD = model.score.head_query(r_BD, model.gather(t))
                rows, cols = heads.pairs(batch[:, 2], batch[:, 1])
                true = h
            scores = [model.score.match_all(q_BD, e_CD) for _, e_CD in model.entity_chunks(C)]
            scores_BE = torch.cat(scores, dim=1)
            ranks[side].append(filtered_ranks(scores_BE, true.to(model.device), rows, cols)
                               .cpu().numpy())  # fmt: skip
            bar.update(len(batch))
    bar.close()
    tail = np.concatenate(ranks["tail"]) if ranks["tail"] else np.zeros(0)
    head = np.concatenate(ranks["head"]) if ranks["head"] else np.zeros(0)
    return {"tail": rank_metrics(tail), "head": rank_metrics(head),
            "both": rank_metrics(np.concatenate([tail, head]))}  # fmt: skip
