"""KEPLER's knowledge-embedding loss against a hand computation; its corruptions."""

from __future__ import annotations

import math

import pytest
import torch

from mmptm.batch import PAIRS
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.kepler import KnowledgeEmbedding, SampleCorruptions


def test_corruptions_are_other_triples_and_seeded():
    batch = {"relation_ids": torch.zeros(5, dtype=torch.long), PAIRS: "stacked"}
    out = SampleCorruptions(negatives=40)(dict(batch), torch.Generator().manual_seed(0))
    neg, head = out["ke_negatives"], out["ke_corrupt_head"]
    assert neg.shape == head.shape == (5, 40)
    assert not (neg == torch.arange(5)[:, None]).any() and neg.max() < 5
    assert 0.3 < head.float().mean() < 0.7
    again = SampleCorruptions(negatives=40)(dict(batch), torch.Generator().manual_seed(0))
    assert torch.equal(again["ke_negatives"], neg)
    text_batch = {"relation_ids": torch.full((5,), -1)}  # not stacked: a text source's batch
    assert "ke_negatives" not in SampleCorruptions(3)(text_batch, torch.Generator())


def _rotate_distance(h, phase, t):  # Σ_k |h_k e^{iθ_k} − t_k|, with Python complex numbers
    k = len(phase)
    return sum(
        abs(complex(h[j], h[k + j]) * complex(math.cos(phase[j]), math.sin(phase[j]))
            - complex(t[j], t[k + j]))
        for j in range(k)
    )  # fmt: skip


@pytest.mark.parametrize("model", ["transe", "rotate"])
def test_loss_by_hand(model):
    torch.manual_seed(0)
    cfg = KnowledgeEmbedding.Config(num_relations=3, negatives=2, model=model)
    ke = KnowledgeEmbedding(cfg, width=4)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(6, 5, 4, generator=g)  # rows 0-2 heads, 3-5 tails; token 0 = [CLS]
    rel = torch.tensor([2, 0, 1])
    neg = torch.tensor([[1, 2], [0, 2], [0, 1]])
    corrupt_head = torch.tensor([[True, False], [False, False], [True, True]])
    out = FusionOutput({"text": hidden}, {"text": torch.ones(6, 5).bool()}, {})
    batch = {"relation_ids": rel, "ke_negatives": neg, "ke_corrupt_head": corrupt_head}
    got = ke(out, batch)
    R = ke.relations.weight.detach()
    if model == "rotate":  # the table holds θ · 0.1 / π (RotatE's scaled phases)
        R = R * math.pi / 0.1
        assert (R.abs() <= math.pi).all() and R.abs().max() > 1.0  # θ drawn in (−π, π)
    cls = hidden[:, 0]

    def d(h, r, t):  # ‖h + r − t‖₁, or RotatE's ‖h ∘ e^{iθ} − t‖
        if model == "rotate":
            return _rotate_distance(h.tolist(), r.tolist(), t.tolist())
        return float((h + r - t).abs().sum())

    def logsig(x):
        return -math.log1p(math.exp(-x))

    total = 0.0
    for i in range(3):
        h, t, r = cls[i], cls[3 + i], R[rel[i]]
        pos = -logsig(4.0 - d(h, r, t))
        negs = []
        for j in range(2):
            k = int(neg[i, j])
            hh, tt = (cls[k], t) if corrupt_head[i, j] else (h, cls[3 + k])
            negs.append(-logsig(d(hh, r, tt) - 4.0))
        total += pos + sum(negs) / 2
    assert got["loss"].item() == pytest.approx(total / 3, rel=1e-5)
    got["loss"].backward()
    assert ke.relations.weight.grad.abs().sum() > 0
    assert ke.relations.weight.shape == (3, 2 if model == "rotate" else 4)  # phases: D/2


def test_rotate_phase_of_pi_is_symmetric_without_collapse():
    """The reason for ``model: rotate``: TransE's only symmetric relation is r = 0, which
    scores (h, r, h) best; a rotation by π scores (h, r, t) and (t, r, h) alike, not (h, r, h)."""
    ke = KnowledgeEmbedding(KnowledgeEmbedding.Config(num_relations=1, model="rotate"), width=4)
    h = torch.tensor([1.0, 0.5, 0.2, -0.3])
    t = -h  # h rotated by π in every complex component
    pi = torch.full((2,), math.pi)
    assert float(ke.score(h, pi, t)) == pytest.approx(0.0, abs=1e-6)
    assert float(ke.score(t, pi, h)) == pytest.approx(0.0, abs=1e-6)
    assert float(ke.score(h, pi, h)) < -1.0


@pytest.mark.parametrize(
    ("model", "width", "message"),
    [("transh", 4, "unknown 'transh'"), ("rotate", 5, "needs an even width")],
)
def test_bad_model_named(model, width, message):
    with pytest.raises(ValueError, match=message):
        KnowledgeEmbedding(KnowledgeEmbedding.Config(num_relations=1, model=model), width=width)


def test_inactive_on_text_batches():
    ke = KnowledgeEmbedding(KnowledgeEmbedding.Config(num_relations=1), width=4)
    out = FusionOutput({"text": torch.randn(2, 3, 4)}, {"text": torch.ones(2, 3).bool()}, {})
    assert ke(out, {"relation_ids": torch.full((2,), -1)}) == {}
