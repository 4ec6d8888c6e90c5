"""Knowledge-graph scores and losses against hand computations."""

import math

import torch

from mmptm.layers.kge import Scorer, distance, distmult_score, kge_loss, transe_score


def test_transe_score_by_hand():
    h = torch.tensor([1.0, 2.0, -1.0])
    r = torch.tensor([0.5, -1.0, 2.0])
    t = torch.tensor([1.0, 0.0, 0.0])
    # h + r − t = (0.5, 1.0, 1.0): L1 = 2.5, L2 = 1.5
    assert transe_score(h, r, t, p=1).item() == -2.5
    assert math.isclose(transe_score(h, r, t, p=2).item(), -1.5, rel_tol=1e-6)
    assert Scorer("transe", 2)(h, r, t).item() == transe_score(h, r, t, 2).item()
    # broadcasting: one query [1,1,D] against 2 candidate tails [1,2,D]
    tails = torch.stack([t, h + r])[None]
    torch.testing.assert_close(Scorer("transe")(h[None, None], r[None, None], tails),
                               torch.tensor([[-2.5, 0.0]]))  # fmt: skip
    assert distmult_score(h, r, t).item() == 0.5  # 1·0.5·1 + 2·(−1)·0 + (−1)·2·0


def test_losses_by_hand():
    pos = torch.tensor([-1.0])
    neg = torch.tensor([[-3.0, -5.0]])
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    # margin ranking, γ = 2: mean(max(0, 2 + 1 − 3), max(0, 2 + 1 − 5)) = 0
    assert kge_loss("margin", pos, neg, 2.0).item() == 0.0
    assert kge_loss("margin", pos, neg, 3.0).item() == 0.5  # (1 + 0) / 2
    # nssa, γ = 4, α = 1: weights softmax(−3, −5)
    w = [math.exp(-3) / (math.exp(-3) + math.exp(-5)), math.exp(-5) / (math.exp(-3) + math.exp(-5))]
    want = -math.log(sig(4 - 1)) - (w[0] * math.log(sig(3 - 4)) + w[1] * math.log(sig(5 - 4)))
    assert math.isclose(kge_loss("nssa", pos, neg, 4.0, 1.0).item(), want, rel_tol=1e-6)
    # α = 0: KEPLER's uniform mean over negatives
    want0 = -math.log(sig(3)) - 0.5 * (math.log(sig(-1)) + math.log(sig(1)))
    assert math.isclose(kge_loss("nssa", pos, neg, 4.0, 0.0).item(), want0, rel_tol=1e-6)


def test_l1_distance_gradients_match_vector_norm():
    torch.manual_seed(0)
    a = torch.randn(4, 3, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(1, 3, 6, dtype=torch.float64, requires_grad=True)  # broadcast
    w = torch.randn(4, 3, dtype=torch.float64)
    (distance(a, b, 1) * w).sum().backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    (torch.linalg.vector_norm(a - b, ord=1, dim=-1) * w).sum().backward()
    torch.testing.assert_close(ga, a.grad)
    torch.testing.assert_close(gb, b.grad)
    assert torch.autograd.gradcheck(lambda x, y: distance(x, y, 1), (a, b))


def test_query_form_equals_the_score():
    torch.manual_seed(0)
    h, r, t = torch.randn(3, 5, 8).unbind(0)
    for s in (Scorer("transe", 1), Scorer("transe", 2), Scorer("distmult")):
        want = s(h, r, t)
        torch.testing.assert_close(s.match(s.tail_query(h, r), t), want)
        torch.testing.assert_close(s.match(s.head_query(r, t), h), want)
        # all-entity matching: row i, column j = score of (h_i, r_i, t_j)
        full = s.match_all(s.tail_query(h, r), t)
        torch.testing.assert_close(full.diagonal(), want)
        torch.testing.assert_close(full[1, 3], s(h[1], r[1], t[3]))
