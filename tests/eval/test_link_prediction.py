"""Filtered link prediction against a brute-force numpy implementation (ties included)."""

import numpy as np
import pytest
import torch

from mmptm.eval.link_prediction import filtered_ranks, link_prediction, rank_metrics
from mmptm.models.kge import KGEModel


def brute_rank(scores, true, removed):
    """Realistic rank: mean of 1 + #higher and 1 + #(higher or equal) among the kept others."""
    higher = equal = 0
    for e, s in enumerate(scores):
        if e == true or e in removed:
            continue
        higher += s > scores[true]
        equal += s == scores[true]
    return ((higher + 1) + (higher + equal + 1)) / 2


def test_filtered_ranks_with_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, size=(20, 30)).astype(np.float32)  # many ties
    true = rng.integers(0, 30, size=20)
    removed = [set(rng.choice(30, size=rng.integers(0, 6), replace=False)) for _ in range(20)]
    removed[0].add(int(true[0]))  # the true entry itself among the removed: still ranked
    rows = np.array([i for i, rem in enumerate(removed) for _ in rem], dtype=np.int64)
    cols = np.array([c for rem in removed for c in rem], dtype=np.int64)
    got = filtered_ranks(torch.tensor(scores), torch.tensor(true), rows, cols).numpy()
    want = [brute_rank(scores[i], true[i], removed[i]) for i in range(20)]
    np.testing.assert_array_equal(got, want)
    # all scores equal: the expected rank of a random order, (E + 1) / 2
    flat = filtered_ranks(torch.zeros(1, 30), torch.tensor([3]), np.zeros(0, int), np.zeros(0, int))
    assert flat.item() == 15.5


def numpy_score(model, h, r, t):
    if model == "transe":
        return -np.abs(h + r - t).sum(-1)
    return (h * r * t).sum(-1)


@pytest.mark.parametrize("model", ["transe", "distmult"])
def test_link_prediction_matches_brute_force(model):
    rng = np.random.default_rng(1)
    n_ent, n_rel = 25, 3
    known = np.unique(np.stack([rng.integers(0, n_ent, 120), rng.integers(0, n_rel, 120),
                                rng.integers(0, n_ent, 120)], 1), axis=0)  # fmt: skip
    test = known[rng.choice(len(known), 30, replace=False)]
    kge = KGEModel(n_ent, n_rel, 4, model=model, p_norm=1, normalize_entities=False)
    # small integer embeddings: exact float scores, so ties happen and must be handled
    ent = rng.integers(-1, 2, size=(n_ent, 4)).astype(np.float32)
    rel = rng.integers(-1, 2, size=(n_rel, 4)).astype(np.float32)
    kge.entities.copy_(torch.tensor(ent))
    kge.relations.data.copy_(torch.tensor(rel))
    got = link_prediction(kge, test, known, batch_size=7)
    true_set = set(map(tuple, known.tolist()))
    tail, head = [], []
    for h, r, t in test.tolist():
        s_tail = numpy_score(model, ent[h], rel[r], ent)
        tail.append(brute_rank(s_tail, t, {e for e in range(n_ent) if (h, r, e) in true_set}))
        s_head = numpy_score(model, ent, rel[r], ent[t])
        head.append(brute_rank(s_head, h, {e for e in range(n_ent) if (e, r, t) in true_set}))
    tail, head = np.array(tail), np.array(head)
    for side, ranks in (("tail", tail), ("head", head), ("both", np.concatenate([tail, head]))):
        assert got[side]["mrr"] == pytest.approx(np.mean(1 / ranks))
        assert got[side]["hits@1"] == pytest.approx(np.mean(ranks <= 1))
        assert got[side]["hits@3"] == pytest.approx(np.mean(ranks <= 3))
        assert got[side]["hits@10"] == pytest.approx(np.mean(ranks <= 10))
        assert got[side]["mean_rank"] == pytest.approx(np.mean(ranks))
    # ties do occur here (ranks with a .5), so the tie policy is exercised
    assert np.any(tail % 1 == 0.5) or np.any(head % 1 == 0.5)


def test_rank_metrics_by_hand():
    m = rank_metrics(np.array([1.0, 2.0, 4.0, 20.0]))
    assert m["mrr"] == pytest.approx((1 + 0.5 + 0.25 + 0.05) / 4)
    assert (m["hits@1"], m["hits@3"], m["hits@10"]) == (0.25, 0.5, 0.75)


def complex_rows(x):
    """[re | im] rows → numpy complex numbers."""
    k = x.shape[-1] // 2
    return x[..., :k] + 1j * x[..., k:]


@pytest.mark.parametrize("model", ["rotate", "complex"])
def test_rotate_and_complex_link_prediction_match_brute_force(model):
    rng = np.random.default_rng(2)
    n_ent, n_rel, dim = 30, 3, 6
    known = np.unique(np.stack([rng.integers(0, n_ent, 150), rng.integers(0, n_rel, 150),
                                rng.integers(0, n_ent, 150)], 1), axis=0)  # fmt: skip
    test = known[rng.choice(len(known), 40, replace=False)]
    kge = KGEModel(n_ent, n_rel, dim, model=model, p_norm=1)
    if model == "complex":  # small integers: exact scores, so ties occur
        ent = rng.integers(-1, 2, size=(n_ent, dim)).astype(np.float32)
        rel = rng.integers(-1, 2, size=(n_rel, dim)).astype(np.float32)
        rel_c = complex_rows(rel.astype(np.float64))
    else:
        ent = rng.standard_normal((n_ent, dim)).astype(np.float32)
        rel = rng.uniform(-np.pi, np.pi, size=(n_rel, dim // 2)).astype(np.float32)
        rel_c = np.exp(1j * rel.astype(np.float64))
    kge.entities.copy_(torch.tensor(ent))
    kge.relations.data.copy_(torch.tensor(rel))
    ent_c = complex_rows(ent.astype(np.float64))

    def score(h, r, t):  # numpy's complex arithmetic, by the papers' formulas
        if model == "rotate":
            return -np.abs(ent_c[h] * rel_c[r] - ent_c[t]).sum(-1)
        return np.real(ent_c[h] * rel_c[r] * np.conj(ent_c[t])).sum(-1)

    got = link_prediction(kge, test, known, batch_size=7, per_relation=True)
    true_set = set(map(tuple, known.tolist()))
    everyone = np.arange(n_ent)
    tail, head = [], []
    for h, r, t in test.tolist():
        s_tail = score(h, r, everyone)
        tail.append(brute_rank(s_tail, t, {e for e in range(n_ent) if (h, r, e) in true_set}))
        s_head = score(everyone, r, t)
        head.append(brute_rank(s_head, h, {e for e in range(n_ent) if (e, r, t) in true_set}))
    tail, head = np.array(tail), np.array(head)
    both = np.concatenate([tail, head])
    assert got["both"]["mrr"] == pytest.approx(np.mean(1 / both))
    assert got["tail"]["hits@3"] == pytest.approx(np.mean(tail <= 3))
    assert got["head"]["hits@1"] == pytest.approx(np.mean(head <= 1))
    for r in range(n_rel):
        mask = test[:, 1] == r
        ranks_r = np.concatenate([tail[mask], head[mask]])
        assert got["by_relation"][r]["mrr"] == pytest.approx(np.mean(1 / ranks_r))
    if model == "complex":
        assert np.any(both % 1 == 0.5)  # ties exercised
