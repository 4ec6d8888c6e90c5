"""ALBEF-style parts: unimodal towers before a joint stack, ITC on them, re-pairing without
re-encoding, and ITM with hard negatives drawn from the contrastive similarities."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import text_image_model_config

from mmptm.config import from_dict
from mmptm.encoders.base import VocabInfo
from mmptm.fusion.base import FusionOutput, pool
from mmptm.fusion.single_stream import SingleStreamFusion
from mmptm.models.pretrain import PretrainModel, data_transforms
from mmptm.objectives.contrastive import Contrastive

VOCAB = VocabInfo(vocab_size=50, special_ids=frozenset({0, 1, 2, 3, 4}))
B = 6


def _model(towers: dict[str, int] | None = None, **itm) -> PretrainModel:
    cfg = text_image_model_config(
        fusion={"type": "single_stream", "transformer": {"layers": 1, "heads": 2},
                "unimodal_layers": towers or {}},
        objectives={
            "itc": {"type": "contrastive", "modalities": ["image", "text"], "source": "unimodal"},
            "itm": {"type": "itm", "negatives": "hard", "similarity": "itc", **itm},
        },
    )  # fmt: skip
    torch.manual_seed(0)
    return PretrainModel(cfg, VOCAB).eval()


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50, (B, 10), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3
    mask = torch.ones(B, 10, dtype=torch.bool)
    mask[1, 7:] = False
    ids[1, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask, "pixels": torch.randn(B, 3, 16, 16)}


def _reindexed(batch: dict[str, torch.Tensor], text_rows, image_rows) -> dict[str, torch.Tensor]:
    return {
        "input_ids": batch["input_ids"][text_rows],
        "attention_mask": batch["attention_mask"][text_rows],
        "pixels": batch["pixels"][image_rows],
    }


def test_towers_keep_each_modality_apart_until_the_joint_stack():
    model = _model({"text": 1, "image": 1})
    batch = _batch()
    other = {**batch, "pixels": torch.randn(B, 3, 16, 16)}
    with torch.no_grad():
        a, b = model.fuse(batch), model.fuse(other)
        text = model.encoders["text"](batch)
        tower = model.fusion.towers["text"](text.tokens, text.mask)
    assert torch.allclose(a.unimodal["text"], pool(tower, text.mask, "mean"), atol=1e-6)
    assert torch.allclose(a.unimodal["text"], b.unimodal["text"])  # blind to the image
    assert not torch.allclose(a.pooled["text"], b.pooled["text"], atol=1e-3)  # fused: not


def test_without_towers_unimodal_is_the_pooled_encoder_tokens():
    model = _model()
    batch = _batch()
    with torch.no_grad():
        out = model.fuse(batch)
        text = model.encoders["text"](batch)
    assert torch.allclose(out.unimodal_vector("text"), pool(text.tokens, text.mask, "mean"))


def test_single_stream_rejects_towers_for_missing_modalities():
    cfg = from_dict(SingleStreamFusion.Config, {"unimodal_layers": {"audio": 1}})
    with pytest.raises(ValueError, match="audio"):
        SingleStreamFusion(cfg, width=16, modalities=["text", "image"])


@pytest.mark.parametrize("towers", [None, {"text": 1, "image": 1}], ids=["generic", "towers"])
def test_repair_equals_fusing_the_reindexed_batch(towers):
    model = _model(towers)
    batch = _batch()
    text_rows, image_rows = torch.tensor([2, 0, 1, 1, 5]), torch.tensor([0, 0, 4, 1, 3])
    with torch.no_grad():
        repaired = model.fuse(batch).repair({"text": text_rows, "image": image_rows})
        direct = model.fuse(_reindexed(batch, text_rows, image_rows))
    for key in ("joint", "text", "image"):
        assert torch.allclose(repaired.pooled[key], direct.pooled[key], atol=1e-5), key


def test_contrastive_source_unimodal_reads_the_unimodal_vectors():
    cfg = from_dict(Contrastive.Config, {"modalities": ["image", "text"], "source": "unimodal"})
    head = Contrastive(cfg, width=4)
    u, p = torch.randn(3, 4), torch.randn(3, 4)
    out = FusionOutput({}, {}, pooled={"text": p}, unimodal={"text": u})
    expected = F.normalize(u @ head.proj["text"].weight.T, dim=-1)
    assert torch.allclose(head.embed(out, "text"), expected, atol=1e-6)
    with pytest.raises(ValueError, match="source"):
        Contrastive(from_dict(Contrastive.Config, {"source": "fused"}), width=4)


def _rigged(model: PretrainModel, monkeypatch) -> None:
    """ITC embeddings under which image i's most similar text is (i+1) % B and text j's most
    similar image is (j+2) % B; the true pairs score below both."""
    eye = torch.eye(B)

    def embed(out, modality):
        if modality == "image":
            return eye
        return F.normalize(0.6 * eye + eye.roll(1, 0) + 0.9 * eye.roll(-2, 0), dim=-1)

    monkeypatch.setattr(model.objectives["itc"], "embed", embed)
    with torch.no_grad():
        model.objectives["itc"].logit_scale.fill_(torch.log(torch.tensor(100.0)))


def test_hard_negatives_are_the_most_similar_other_samples(monkeypatch):
    model = _model({"text": 1})
    _rigged(model, monkeypatch)
    # independently: s[i, j] = image i · text j; per image, the best other text; per text the
    # best other image
    texts = F.normalize(
        0.6 * torch.eye(B) + torch.eye(B).roll(1, 0) + 0.9 * torch.eye(B).roll(-2, 0), dim=-1
    )
    s = texts.T  # image i · text j = texts[j, i]
    s_off = s.masked_fill(torch.eye(B, dtype=torch.bool), -1)
    best_text, best_image = s_off.argmax(1), s_off.argmax(0)
    assert torch.equal(best_text, (torch.arange(B) + 1) % B)
    hits = total = 0
    with torch.no_grad():
        out = model.fuse(_batch())
        for _ in range(20):
            _, rows = model.objectives["itm"].hard_pairs(out)
            image_rows, text_rows = rows[:, 0], rows[:, 1]
            assert torch.equal(image_rows[:B], torch.arange(B))  # each image with a wrong text
            assert torch.equal(text_rows[B:], torch.arange(B))  # each text with a wrong image
            assert bool((text_rows[:B] != torch.arange(B)).all())
            assert bool((image_rows[B:] != torch.arange(B)).all())
            hits += int((text_rows[:B] == best_text).sum() + (image_rows[B:] == best_image).sum())
            total += 2 * B
    assert hits / total > 0.95


def test_hard_itm_loss_matches_an_independent_computation(monkeypatch):
    model = _model({"text": 1, "image": 1})
    _rigged(model, monkeypatch)
    batch = _batch()
    itm = model.objectives["itm"]
    with torch.no_grad():
        out = model.fuse(batch)
        torch.manual_seed(7)
        got = itm(out, batch)
        torch.manual_seed(7)
        _, rows = itm.hard_pairs(out)
        negatives = model.fuse(_reindexed(batch, rows[:, 1], rows[:, 0])).pooled["joint"]
        logits = itm.head(torch.cat([out.pooled["joint"], negatives]))
    labels = torch.tensor([1] * B + [0] * (2 * B))
    assert got["loss"].item() == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-5)
    assert got["acc"].item() == pytest.approx((logits.argmax(-1) == labels).float().mean().item())


def test_hard_itm_has_no_data_side_and_sits_out_batches_without_both_sides():
    model = _model({"text": 1})
    assert data_transforms(model.cfg, VOCAB) == []  # negatives are drawn on the model side
    text_only = {k: v for k, v in _batch().items() if k != "pixels"}
    with torch.no_grad():
        assert model.objectives["itm"](model.fuse(text_only), text_only) == {}


@pytest.mark.parametrize("similarity", ["", "itm", "nope"])
def test_hard_itm_needs_a_contrastive_objective_to_rank_negatives(similarity):
    with pytest.raises(ValueError, match="itm.similarity"):
        _model(similarity=similarity)


def test_itm_negatives_must_be_known():
    with pytest.raises(ValueError, match="itm.negatives"):
        _model(negatives="hardest")
