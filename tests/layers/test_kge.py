"""Knowledge-graph scores and losses against hand computations."""

import math

import torch

from mmptm.layers.kge import (
    Scorer,
    complex_score,
    distance,
    distmult_score,
    kge_loss,
    rotate_score,
    transe_score,
)


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


def _as_complex(x: torch.Tensor) -> torch.Tensor:
    """[re | im] rows → a complex tensor (torch's own complex arithmetic is the reference)."""
    re, im = x.chunk(2, dim=-1)
    return torch.complex(re, im)


def test_rotate_and_complex_scores_by_hand():
    # one complex dimension: h = 1 + 2i, θ = π/2 (multiply by i), t = −1 + 1i
    h = torch.tensor([1.0, 2.0])
    t = torch.tensor([-1.0, 1.0])
    theta = torch.tensor([math.pi / 2])
    # h·i = −2 + i; minus t = −1 + 0i: modulus 1
    assert math.isclose(rotate_score(h, theta, t, p=1).item(), -1.0, abs_tol=1e-6)
    assert math.isclose(Scorer("rotate", 2)(h, theta, t).item(), -1.0, abs_tol=1e-6)
    # ComplEx, r = 2 − i: h·r = (1 + 2i)(2 − i) = 4 + 3i; Re((4 + 3i)·conj(−1 + i)) = −4 + 3 = −1
    r = torch.tensor([2.0, -1.0])
    assert math.isclose(complex_score(h, r, t).item(), -1.0, abs_tol=1e-6)
    assert Scorer("complex")(h, r, t).item() == complex_score(h, r, t).item()


def test_rotate_and_complex_against_torch_complex_numbers():
    torch.manual_seed(0)
    h, r, t = torch.randn(3, 4, 6, dtype=torch.float64).unbind(0)
    theta = torch.randn(4, 3, dtype=torch.float64)
    rot = torch.polar(torch.ones_like(theta), theta)
    diff = _as_complex(h) * rot - _as_complex(t)
    torch.testing.assert_close(rotate_score(h, theta, t, 1), -diff.abs().sum(-1))
    torch.testing.assert_close(rotate_score(h, theta, t, 2), -diff.abs().pow(2).sum(-1).sqrt())
    want = (_as_complex(h) * _as_complex(r) * _as_complex(t).conj()).real.sum(-1)
    torch.testing.assert_close(complex_score(h, r, t), want)


def test_rotate_and_complex_query_forms_equal_the_score():
    torch.manual_seed(0)
    h, r, t = torch.randn(3, 5, 8).unbind(0)
    theta = torch.rand(5, 4) * 6 - 3
    for s, rel in ((Scorer("rotate", 1), theta), (Scorer("rotate", 2), theta),
                   (Scorer("complex"), r)):  # fmt: skip
        want = s(h, rel, t)
        torch.testing.assert_close(s.match(s.tail_query(h, rel), t), want)
        torch.testing.assert_close(s.match(s.head_query(rel, t), h), want)
        full = s.match_all(s.tail_query(h, rel), t)
        torch.testing.assert_close(full.diagonal(), want)
        torch.testing.assert_close(full[1, 3], s(h[1], rel[1], t[3]))
        full_head = s.match_all(s.head_query(rel, t), h)
        torch.testing.assert_close(full_head[2, 0], s(h[0], rel[2], t[2]))


def test_rotate_gradient_is_finite_where_a_modulus_is_zero():
    h = torch.tensor([[1.0, 0.0, 0.0, 1.0]], requires_grad=True)
    t = torch.tensor([[1.0, 0.0, 0.0, 1.0]])  # equal to h: every modulus of h·e^{i0} − t is 0
    rotate_score(h, torch.zeros(1, 2), t, 1).sum().backward()
    assert torch.isfinite(h.grad).all()


def test_symmetric_relation_representable_by_rotate_and_complex_not_transe():
    # a symmetric pair a ≠ b: TransE needs a + r = b and b + r = a, so r = 0 and a = b;
    # a rotation by π maps a → −a = b and b → a; a real ComplEx relation scores both alike
    a = torch.tensor([1.0, 2.0, 0.5, -1.0])
    b = -a
    pi = torch.full((2,), math.pi)
    s = Scorer("rotate", 1)
    assert s(a, pi, b).item() > -1e-5 and s(b, pi, a).item() > -1e-5
    assert s(a, pi, a).item() < -1.0  # and a itself is not an answer
    c = Scorer("complex")
    r = torch.tensor([0.7, -0.2, 0.0, 0.0])  # imaginary part 0
    assert math.isclose(c(a, r, b).item(), c(b, r, a).item(), rel_tol=1e-6)
    # TransE: whatever r, the two distances add up to ≥ ‖(a + r − b) − (b + r − a)‖₁ = 2‖a − b‖₁
    tr = Scorer("transe", 1)
    best = max(tr(a, rr, b).item() + tr(b, rr, a).item()
               for rr in torch.linspace(-3, 3, 61)[:, None] * torch.ones(4))  # fmt: skip
    assert best <= -2 * distance(a, b, 1).item() + 1e-5  # triangle inequality


def test_modulus_sum_gradients_match_torch_complex_abs():
    from mmptm.layers.kge import complex_distance

    torch.manual_seed(1)
    a = torch.randn(4, 3, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(1, 3, 6, dtype=torch.float64, requires_grad=True)  # broadcast
    w = torch.randn(4, 3, dtype=torch.float64)
    (complex_distance(a, b, 1) * w).sum().backward()
    ga, gb = a.grad.clone(), b.grad.clone()
    a.grad = b.grad = None
    ((_as_complex(a) - _as_complex(b)).abs().sum(-1) * w).sum().backward()
    torch.testing.assert_close(ga, a.grad)
    torch.testing.assert_close(gb, b.grad)
    assert torch.autograd.gradcheck(lambda x, y: complex_distance(x, y, 1), (a, b))
