"""ITM: negative sampling, consistent swaps, the matching head's loss."""

from __future__ import annotations

import math

import pytest
import torch

from mmptm.encoders.base import VocabInfo
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.text import PackPairs
from mmptm.objectives.itm import (
    ImageTextMatching,
    SwapNegatives,
    overlap_partners,
    sample_negatives,
)
from mmptm.objectives.mlm import MaskTokens

VOCAB = VocabInfo(vocab_size=10)


def test_sample_negatives_never_self_and_rate_matches_prob() -> None:
    g = torch.Generator().manual_seed(0)
    B, draws, prob = 8, 1500, 0.3
    parts = torch.stack([sample_negatives(B, prob, g) for _ in range(draws)])  # [draws,B]
    assert parts.dtype == torch.long
    assert bool(((parts >= 0) & (parts < B)).all())
    neg = parts != torch.arange(B)
    assert abs(neg.float().mean().item() - prob) < 0.02
    # negatives pick every other sample about equally often: each of the B-1 others ≈ 1/(B-1)
    i = torch.arange(B).expand(draws, B)
    shift = (parts - i) % B
    counts = torch.bincount(shift[neg], minlength=B)
    assert counts[0] == 0  # (a shift of 0 would be a sample paired with itself)
    share = counts[1:].float() / neg.sum()
    assert bool(((share - 1 / (B - 1)).abs() < 0.03).all()), share


def test_sample_negatives_extremes() -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        assert torch.equal(sample_negatives(1, 1.0, g), torch.tensor([0]))
        assert torch.equal(sample_negatives(2, 1.0, g), torch.tensor([1, 0]))
        assert torch.equal(sample_negatives(5, 0.0, g), torch.arange(5))
        assert bool((sample_negatives(5, 1.0, g) != torch.arange(5)).all())


def test_sample_negatives_is_seeded() -> None:
    a = sample_negatives(16, 0.5, torch.Generator().manual_seed(3))
    b = sample_negatives(16, 0.5, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    draws = {
        tuple(sample_negatives(16, 0.5, torch.Generator().manual_seed(s)).tolist())
        for s in range(5)
    }
    assert len(draws) > 1


def test_swap_negatives_moves_image_keys_together() -> None:
    g = torch.Generator().manual_seed(0)
    B = 12
    pixels = torch.randn(B, 3, 4, 4, generator=g)
    boxes = torch.arange(B, dtype=torch.float32)[:, None].expand(B, 4).clone()
    ids = torch.randint(0, 10, (B, 5), generator=g)
    batch = {"pixels": pixels.clone(), "boxes": boxes.clone(), "input_ids": ids.clone()}
    t = ImageTextMatching.data_transform(
        ImageTextMatching.Config(prob_negative=0.5, swap_keys=["pixels", "boxes"]), VOCAB
    )
    assert isinstance(t, SwapNegatives)
    out = t(batch, torch.Generator().manual_seed(4))
    labels = out["itm_labels"]
    assert labels.dtype == torch.long and labels.shape == (B,)
    assert 0 < int(labels.sum()) < B  # both kinds present for this seed
    # which original image each sample now holds, found by matching pixels
    flat = pixels.flatten(1)
    partner = torch.tensor(
        [int((flat == row).all(1).nonzero()[0]) for row in out["pixels"].flatten(1)]
    )
    unchanged = partner == torch.arange(B)
    assert torch.equal(labels, unchanged.long())
    # the other image key followed the same permutation; text is untouched
    assert torch.equal(out["boxes"][:, 0].long(), partner)
    assert torch.equal(out["input_ids"], ids)


def test_swap_negatives_missing_key_raises_naming_it() -> None:
    t = SwapNegatives(0.5, ["pixels", "regions"])
    with pytest.raises(KeyError, match="regions"):
        t({"pixels": torch.zeros(4, 3, 2, 2)}, torch.Generator())


def test_prob_negative_is_validated() -> None:
    with pytest.raises(ValueError, match="prob_negative"):
        ImageTextMatching.data_transform(ImageTextMatching.Config(prob_negative=1.5), VOCAB)


def test_negatives_run_before_pair_joining_and_masking() -> None:
    assert SwapNegatives.data_priority < PackPairs.data_priority < MaskTokens.data_priority


def _out(pooled: dict[str, torch.Tensor]) -> FusionOutput:
    return FusionOutput({}, {}, pooled)


def test_itm_needs_joint_pooled_vector() -> None:
    torch.manual_seed(0)
    head = ImageTextMatching(ImageTextMatching.Config(), width=8)
    out = _out({"text": torch.randn(2, 8), "image": torch.randn(2, 8)})
    with pytest.raises(ValueError, match="joint"):
        head(out, {"itm_labels": torch.tensor([1, 0])})


def test_itm_loss_matches_independent_cross_entropy() -> None:
    torch.manual_seed(0)
    itm = ImageTextMatching(ImageTextMatching.Config(), width=8)
    with torch.no_grad():
        itm.head.weight.normal_()
        itm.head.bias.normal_()
    g = torch.Generator().manual_seed(1)
    joint = torch.randn(6, 8, generator=g)
    labels = torch.tensor([1, 0, 0, 1, 1, 0])
    res = itm(_out({"joint": joint}), {"itm_labels": labels})
    W = itm.head.weight.detach().double()
    b = itm.head.bias.detach().double()
    total, correct = 0.0, 0
    for i in range(6):
        z = [float(joint[i].double() @ W[c] + b[c]) for c in range(2)]
        m = max(z)
        lse = m + math.log(sum(math.exp(zc - m) for zc in z))
        total += lse - z[int(labels[i])]
        correct += int((z[1] > z[0]) == bool(labels[i]))
    torch.testing.assert_close(res["loss"].double(), torch.tensor(total / 6, dtype=torch.float64))
    assert res["acc"].item() == pytest.approx(correct / 6)
    # score(): the margin logit[1] - logit[0]
    margin = (joint.double() @ W.T + b) @ torch.tensor([-1.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(
        itm.score(_out({"joint": joint})).double(), margin, rtol=1e-5, atol=1e-5
    )


# [CLS]=2 [SEP]=3 [PAD]=0 are special; row 3 has row 0's pieces exactly
OVERLAP_IDS = torch.tensor([
    [2, 10, 11, 12, 3, 0],
    [2, 10, 11, 13, 3, 0],
    [2, 20, 21, 22, 3, 0],
    [2, 12, 11, 10, 10, 3],
    [2, 20, 21, 23, 3, 0],
])  # fmt: skip


def test_overlap_partners_take_the_closest_other_caption_never_an_identical_one() -> None:
    real = OVERLAP_IDS != 0
    special = torch.tensor([0, 2, 3])
    for seed in range(20):
        got = overlap_partners(OVERLAP_IDS, real, special, torch.Generator().manual_seed(seed))
        # Jaccard by hand over {10,11,12} {10,11,13} {20,21,22} {10,11,12} {20,21,23}:
        # 0-1 2/4, 0-3 1 (same set: excluded), 2-4 2/4, 1-3 2/4, others 0
        assert got[0] == 1 and got[2] == 4 and got[3] == 1 and got[4] == 2
        assert got[1] in (0, 3)  # a tie, drawn


def test_overlap_negatives_swap_the_image_of_the_closest_caption() -> None:
    vocab = VocabInfo(vocab_size=30, special_ids=frozenset({0, 1, 2, 3, 4}))
    cfg = ImageTextMatching.Config(prob_negative=1.0, negatives="overlap", overlap_share=1.0)
    swap = ImageTextMatching.data_transform(cfg, vocab)
    pixels = torch.arange(5).float().view(5, 1, 1, 1)
    batch = {"input_ids": OVERLAP_IDS.clone(), "attention_mask": OVERLAP_IDS != 0,
             "pixels": pixels.clone()}  # fmt: skip
    out = swap(batch, torch.Generator().manual_seed(0))
    assert out["itm_labels"].tolist() == [0] * 5
    assert out["pixels"].flatten()[[0, 2, 3, 4]].tolist() == [1.0, 4.0, 1.0, 2.0]
    assert torch.equal(out["input_ids"], OVERLAP_IDS)  # the text side stays
    with pytest.raises(ValueError, match="random, overlap or hard"):
        ImageTextMatching.Config(negatives="closest")


def test_overlap_share_mixes_closest_and_random_partners() -> None:
    B = 200
    ids = torch.randint(10, 60, (B, 8), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool),
             "pixels": torch.arange(B).float().view(B, 1, 1, 1)}  # fmt: skip
    sets = [set(r.tolist()) for r in ids]

    def jaccard(i: int, j: int) -> float:  # by hand, over Python sets
        return len(sets[i] & sets[j]) / len(sets[i] | sets[j])

    best = [max(jaccard(i, j) for j in range(B) if j != i and sets[j] != sets[i]) for i in range(B)]

    def closest_share(share: float) -> float:
        swap = SwapNegatives(1.0, ["pixels"], "input_ids", (0, 1, 2, 3), overlap_share=share)
        partner = swap(dict(batch), torch.Generator().manual_seed(0))["pixels"].flatten().long()
        assert (partner != torch.arange(B)).all()
        return sum(jaccard(i, int(p)) == best[i] for i, p in enumerate(partner)) / B

    assert closest_share(1.0) == 1.0
    by_chance = closest_share(0.0)  # a random partner that happens to be a closest one
    assert by_chance < 0.3
    assert closest_share(0.5) == pytest.approx(0.5 + 0.5 * by_chance, abs=0.1)
    with pytest.raises(ValueError, match="overlap_share must be in"):
        ImageTextMatching.Config(overlap_share=1.5)
