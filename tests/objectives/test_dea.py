"""dEA: the noise rates measured over many alignments, seeded; the loss against a manual
softmax over the batch's entities."""

from __future__ import annotations

import math

import pytest
import torch

from mmptm.config import from_dict
from mmptm.fusion.base import FusionOutput
from mmptm.fusion.ernie import ErnieFusion
from mmptm.objectives.dea import DenoiseEntities, DenoisingEntityAutoEncoder


def _ids(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 40, (200, 300), generator=g)
    return ids.masked_fill(torch.rand(200, 300, generator=g) < 0.5, -1)  # half aligned


def test_noise_rates_and_seeding():
    ids = _ids()
    side = DenoiseEntities(replace_prob=0.05, mask_prob=0.15)
    batch = side({"entity_ids": ids.clone()}, torch.Generator().manual_seed(7))
    new, labels = batch["entity_ids"], batch["entity_labels"]
    assert torch.equal(labels, ids)  # targets: every original alignment
    aligned = ids >= 0
    n = int(aligned.sum())
    assert n > 25_000
    masked = (new == -1) & aligned
    replaced = (new >= 0) & (new != ids)
    kept = new == ids
    # 3 standard deviations of a binomial share
    for share, p in ((masked, 0.15), (replaced, 0.05), (kept & aligned, 0.80)):
        assert abs(int(share.sum()) / n - p) < 3 * math.sqrt(p * (1 - p) / n)
    assert torch.equal(new[~aligned], ids[~aligned])  # no alignment invented
    assert set(new[replaced].tolist()) <= set(ids[aligned].tolist())  # the batch's entities
    again = side({"entity_ids": ids.clone()}, torch.Generator().manual_seed(7))
    assert torch.equal(again["entity_ids"], new)
    other = side({"entity_ids": ids.clone()}, torch.Generator().manual_seed(8))
    assert not torch.equal(other["entity_ids"], new)


def test_every_entity_key_is_noised_from_one_pool():
    text = torch.tensor([[3, -1, 3, 3] * 50])
    regions = torch.tensor([[9, -1] * 100])
    side = DenoiseEntities(replace_prob=0.5, mask_prob=0.0)
    b = side({"entity_ids": text.clone(), "region_entity_ids": regions.clone()},
             torch.Generator().manual_seed(0))  # fmt: skip
    assert torch.equal(b["region_entity_labels"], regions)
    # with two entities in the batch, a replaced 3 becomes 9 and a replaced 9 becomes 3
    assert {3, 9} == set(b["entity_ids"][text >= 0].tolist())
    assert {3, 9} == set(b["region_entity_ids"][regions >= 0].tolist())


def _model():
    tree = {
        "type": "ernie",
        "transformer": {"layers": 1, "heads": 2},
        "knowledge_layers": 1, "entity_dim": 4, "entity_heads": 2,
        "entities": {"num_entities": 9, "dim": 4}, "entity_views": {},
    }  # fmt: skip
    torch.manual_seed(0)
    fusion = ErnieFusion(from_dict(ErnieFusion.Config, tree), width=8)
    fusion.entity_keys = {"text": ("text", "entity_ids")}
    dea = DenoisingEntityAutoEncoder(DenoisingEntityAutoEncoder.Config(), width=8, fusion=fusion)
    return fusion, dea


def test_loss_is_a_softmax_over_the_batch_entities():
    fusion, dea = _model()
    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 4, 8, generator=g)
    labels = torch.tensor([[-1, 5, -1, 2], [7, -1, 5, -1]])
    out = FusionOutput({"text": h}, {"text": torch.ones(2, 4).bool()}, {})
    got = dea(out, {"entity_labels": labels})
    cands = [2, 5, 7]  # the batch's distinct entities
    E = fusion.entities.table.weight.detach().double()
    losses, hits = [], []
    for b, j in [(0, 1), (0, 3), (1, 0), (1, 2)]:
        z = dea.transform(h[b, j]).detach().double()
        scores = torch.stack([z @ E[c] for c in cands])
        target = cands.index(int(labels[b, j]))
        losses.append(-(scores[target] - torch.logsumexp(scores, 0)))
        hits.append(float(scores.argmax() == target))
    assert got["loss"].item() == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)
    assert got["acc"].item() == pytest.approx(sum(hits) / 4)
    assert got["candidates"].item() == 3
    got["loss"].backward()
    assert dea.transform[0].weight.grad.abs().sum() > 0


def test_inactive_without_alignments_or_without_the_graph():
    fusion, dea = _model()
    out = FusionOutput({"text": torch.randn(1, 3, 8)}, {"text": torch.ones(1, 3).bool()}, {})
    assert dea(out, {"entity_labels": torch.full((1, 3), -1)}) == {}
    fusion.cfg.knowledge = False
    assert dea(out, {"entity_labels": torch.tensor([[1, -1, 2]])}) == {}


def test_dea_needs_an_entity_fusion():
    from mmptm.fusion.single_stream import SingleStreamFusion

    f = SingleStreamFusion(SingleStreamFusion.Config(), width=8)
    with pytest.raises(ValueError, match="fusion: ernie"):
        DenoisingEntityAutoEncoder(DenoisingEntityAutoEncoder.Config(), width=8, fusion=f)
