"""KnowBERT's KAR: finite with and without mentions, padding mentions change nothing, W2 starts
at W1's pseudo-inverse, the linker learns gold links, and the words read the linked entity."""

from __future__ import annotations

import torch
from torch import nn

from mmptm.layers.kar import KnowledgeAttention, linking_loss

D, E, N_ENT = 32, 16, 20


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(4, 10, D, generator=g)
    spans = torch.tensor(
        [[[1, 2], [4, 4]], [[0, 0], [-1, -1]], [[-1, -1], [-1, -1]], [[3, 7], [5, 6]]]
    )
    cand = torch.randint(0, N_ENT, (4, 2, 3), generator=g)
    cand[1, 0, 2] = -1  # fewer candidates
    prior = torch.softmax(torch.randn(4, 2, 3, generator=g), -1)
    gold = torch.tensor([[0, 2], [1, -1], [-1, -1], [2, 0]])
    return h, spans, cand, prior, gold


def _kar(seed: int = 0) -> tuple[KnowledgeAttention, nn.Embedding]:
    torch.manual_seed(seed)
    return KnowledgeAttention(D, E, heads=2, dropout=0.0).eval(), nn.Embedding(N_ENT, E)


def test_kar_is_finite_and_padding_mentions_change_nothing() -> None:
    kar, table = _kar()
    h, spans, cand, prior, _ = _inputs()
    out = kar(h, spans, cand, prior, table)
    assert out.h_BLD.shape == h.shape and torch.isfinite(out.h_BLD).all()
    assert torch.isinf(out.link_BMC[2]).all() and torch.isinf(out.link_BMC[1, 0, 2])
    # one more (padded) mention slot and candidate column: the same words and scores
    spans2 = torch.cat([spans, torch.full((4, 1, 2), -1)], 1)
    cand2 = torch.cat([cand, torch.full((4, 2, 3), -1)[:, :1]], 1)
    cand2 = torch.cat([cand2, torch.full((4, 3, 1), -1)], 2)
    prior2 = torch.nn.functional.pad(prior, (0, 1, 0, 1))
    out2 = kar(h, spans2, cand2, prior2, table)
    torch.testing.assert_close(out2.h_BLD, out.h_BLD)
    torch.testing.assert_close(out2.link_BMC[:, :2, :3], out.link_BMC)


def test_back_projection_starts_at_the_pseudo_inverse() -> None:
    kar, _ = _kar()
    W1, W2 = kar.proj.weight.detach(), kar.back.weight.detach()  # [E,D], [D,E]
    torch.testing.assert_close(W1 @ W2, torch.eye(E), atol=1e-4, rtol=0)  # W1 W1+ = I (E < D)


def test_words_read_the_linked_entity_only_where_linked() -> None:
    kar, table = _kar()
    h, spans, cand, prior, _ = _inputs()
    out = kar(h, spans, cand, prior, table)
    other = nn.Embedding(N_ENT, E)
    with torch.no_grad():
        other.weight.copy_(table.weight)
        other.weight[cand[0].flatten()] += 1.0  # row 0's candidates change
    out2 = kar(h, spans, cand, prior, other)
    assert not torch.allclose(out2.h_BLD[0], out.h_BLD[0])
    torch.testing.assert_close(out2.h_BLD[2], out.h_BLD[2])  # no mention: no entity read


def test_linker_learns_gold_links() -> None:
    kar, table = _kar()
    kar.train()
    h, spans, cand, prior, gold = _inputs()
    loss0, _ = linking_loss(kar(h, spans, cand, prior, table).link_BMC, gold)
    opt = torch.optim.Adam(list(kar.parameters()) + list(table.parameters()), lr=1e-2)
    for _ in range(60):
        loss, acc = linking_loss(kar(h, spans, cand, prior, table).link_BMC, gold)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.2 * float(loss0.detach()) and float(acc) == 1.0
    # hand check of the loss on a fixed case: CE of [0, ln 3] at gold 1 = ln 4 - ln 3
    link = torch.tensor([[[0.0, torch.log(torch.tensor(3.0)), float("-inf")]]])
    loss, acc = linking_loss(link, torch.tensor([[1]]))
    torch.testing.assert_close(loss, torch.log(torch.tensor(4.0 / 3.0)))
    assert float(acc) == 1.0
    zero, _ = linking_loss(link, torch.tensor([[-1]]))
    assert float(zero) == 0.0
