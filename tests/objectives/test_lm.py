"""Generative objectives: attention modes in single-stream fusion, the lm decoder, clm, and
mBART's noise."""

from __future__ import annotations

import pytest
import torch

from mmptm.batch import ATTENTION_MODE, ATTENTION_MODES, ATTENTION_TARGET
from mmptm.encoders.base import ModalityTokens, VocabInfo
from mmptm.fusion.single_stream import mode_patterns
from mmptm.models.pretrain import PretrainModel, data_transforms
from mmptm.objectives.lm import BartNoise, infill, permute_sentences
from tests.conftest import text_image_model_config

VOCAB = VocabInfo(vocab_size=40, special_ids=frozenset({0, 1, 2, 3, 4}), lang_tags=(5, 6))


def test_mode_patterns_by_hand():
    """Two image tokens then three text tokens; text is the seq2seq target."""
    tokens = {
        "image": ModalityTokens(torch.zeros(1, 2, 4), torch.ones(1, 2, dtype=torch.bool)),
        "text": ModalityTokens(torch.zeros(1, 3, 4), torch.ones(1, 3, dtype=torch.bool)),
    }
    p = mode_patterns(tokens, "text", torch.device("cpu")).int().tolist()
    bidirectional, seq2seq, causal = (p[ATTENTION_MODES.index(m)] for m in ATTENTION_MODES)
    assert bidirectional == [[1] * 5] * 5
    assert seq2seq == [
        [1, 1, 0, 0, 0],  # image tokens see the image only
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],  # a text token sees the image and the text up to itself
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
    ]
    assert causal == [[1 if k <= q else 0 for k in range(5)] for q in range(5)]


def _model(objectives: dict) -> PretrainModel:
    torch.manual_seed(0)
    return PretrainModel(text_image_model_config(objectives=objectives), VOCAB).eval()


def _batch(B: int = 4, L: int = 8, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(7, 40, (B, L), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3
    mask = torch.ones(B, L, dtype=torch.bool)
    return {
        "__key__": [f"s{i}" for i in range(B)],
        "input_ids": ids,
        "attention_mask": mask,
        "segment_ids": torch.zeros(B, L, dtype=torch.long),
        "lang_ids": torch.zeros(B, L, dtype=torch.long),
        "pixels": torch.randn(B, 3, 16, 16, generator=g),
    }


@pytest.mark.parametrize("mode", ["bidirectional", "seq2seq", "causal"])
def test_attention_modes_decide_what_a_change_reaches(mode: str):
    """Changing text piece 5 moves earlier text pieces only bidirectionally, and the image's
    states only when the image may see the text: bidirectionally, or causally (the model
    lists text first, so the image comes after it)."""
    model = _model({"mlm": {"type": "mlm"}})
    a = _batch()
    b = {**a, "input_ids": a["input_ids"].clone()}
    b["input_ids"][:, 5] = 9 if int(a["input_ids"][0, 5]) != 9 else 10
    for batch in (a, b):
        batch[ATTENTION_MODE] = torch.full((4,), ATTENTION_MODES.index(mode))
        batch[ATTENTION_TARGET] = "text"
    ha, hb = model.fuse(a), model.fuse(b)
    earlier_moved = not torch.allclose(ha.hidden["text"][:, :5], hb.hidden["text"][:, :5])
    image_moved = not torch.allclose(ha.hidden["image"], hb.hidden["image"])
    assert earlier_moved == (mode == "bidirectional")
    assert image_moved == (mode != "seq2seq")
    assert not torch.allclose(ha.hidden["text"][:, 5:], hb.hidden["text"][:, 5:])


def test_mlm_attention_modes_drawn_per_row_and_seeded():
    model = _model({"mlm": {"type": "mlm", "attention_modes": {"bidirectional": 1, "seq2seq": 3}}})
    modes = []
    for seed in (0, 0, 1):
        batch, g = _batch(B=64), torch.Generator().manual_seed(seed)
        for t in data_transforms(model.cfg, VOCAB):
            batch = t(batch, g)
        modes.append(batch[ATTENTION_MODE])
    assert torch.equal(modes[0], modes[1]) and not torch.equal(modes[0], modes[2])
    assert set(modes[0].tolist()) == {0, 1}
    assert 0.55 < (modes[0] == 1).float().mean() < 0.95  # seq2seq drawn 3 times in 4


def test_attention_modes_need_single_stream():
    cfg = text_image_model_config(
        fusion={"type": "dual"}, objectives={"clm": {"type": "clm", "attention": "causal"}}
    )
    with pytest.raises(ValueError, match="clm: attention modes need a single_stream fusion"):
        PretrainModel(cfg, VOCAB)


def test_lm_teacher_forcing_equals_step_by_step_decoding():
    """The logits the loss is computed from are those the decoder gives one step at a time,
    with and without its cache: training and generation see the same model."""
    model = _model({"lm": {"type": "lm", "decoder": {"layers": 2, "heads": 2}}})
    lm = model.objectives["lm"]
    batch = _batch()
    batch["attention_mask"][1, 6:] = False  # a shorter target
    out = model.fuse({k: v for k, v in batch.items() if k in ("__key__", "pixels")})
    seq, mask, lang = lm.sequence(batch)
    ctx, ctx_mask = lm.context(out)
    full = lm.head(lm.decoder(lm.embed(seq[:, :-1], lang), mask[:, :-1], ctx, ctx_mask))
    cache = lm.decoder.new_cache()
    for t in range(1, 6):
        step = lm.next_logits(seq[:, :t], ctx, ctx_mask, lang, cache)
        fresh = lm.next_logits(seq[:, :t], ctx, ctx_mask, lang)
        torch.testing.assert_close(step, full[:, t - 1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fresh, full[:, t - 1], atol=1e-5, rtol=1e-5)


def test_lm_context_leaves_the_target_out():
    """Fused with its caption, the image is fused again alone for the decoder: its context
    does not depend on the caption."""
    model = _model({"lm": {"type": "lm", "decoder": {"layers": 1, "heads": 2}}})
    lm = model.objectives["lm"]
    a = _batch()
    b = {**a, "input_ids": a["input_ids"].flip(0)}
    ca, _ = lm.context(model.fuse(a))
    cb, _ = lm.context(model.fuse(b))
    torch.testing.assert_close(ca, cb)
    assert lm.context_views(model.fuse(a)) == ["image"]


def test_lm_language_token_and_itm_negatives():
    model = _model({"lm": {"type": "lm", "lang_token": True, "decoder": {"layers": 1, "heads": 2}}})
    lm = model.objectives["lm"]
    batch = _batch()
    batch["lang_ids"][2:] = 1
    seq, _, _ = lm.sequence(batch)
    assert seq[:, 0].tolist() == [5, 5, 6, 6]  # each row starts from its language's tag
    loss_all = model(batch).terms["lm_loss"]
    batch["itm_labels"] = torch.tensor([1, 0, 0, 0])
    loss_one = model(batch).terms["lm_loss"]
    assert loss_one != loss_all  # the mismatched rows no longer count


def test_clm_learns_a_deterministic_next_piece():
    """Every row is the same sequence: a causal LM reaches accuracy 1 on it, so targets are
    aligned with the positions that predict them."""
    model = _model({"clm": {"type": "clm", "attention": "causal"}}).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seq = torch.tensor([[2, 11, 12, 13, 14, 15, 16, 3]])
    for _ in range(60):
        batch = _batch()
        batch["input_ids"] = seq.expand(4, -1).clone()
        g = torch.Generator().manual_seed(0)
        for t in data_transforms(model.cfg, VOCAB):
            batch = t(batch, g)
        out = model(batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert out.terms["clm_acc"] == 1.0


def test_infill_masks_spans_and_keeps_the_rest_in_order():
    g = torch.Generator().manual_seed(0)
    body = list(range(100, 140))
    out = infill(body, 0.35, 3.5, mask_id=4, g=g)
    kept = [t for t in out if t != 4]
    assert kept == sorted(kept) and set(kept) <= set(body)  # order kept, nothing invented
    assert 40 - 14 - 3 <= len(kept) <= 40 - 14 + 3  # about 35% of 40 pieces masked
    assert out.count(4) >= 1
    assert infill(body, 0.0, 3.5, 4, g) == body


def test_permute_sentences_keeps_each_sentence_whole():
    g = torch.Generator().manual_seed(3)
    ends = frozenset({99})
    body = [1, 2, 99, 3, 99, 4, 5, 6, 99, 7]
    seen = set()
    for _ in range(20):
        out = permute_sentences(body, ends, g)
        assert sorted(out) == sorted(body)
        seen.add(tuple(out))
        cuts, cur = [], []
        for t in out:
            cur.append(t)
            if t in ends:
                cuts.append(tuple(cur))
                cur = []
        cuts.append(tuple(cur)) if cur else None
        assert set(cuts) <= {(1, 2, 99), (3, 99), (4, 5, 6, 99), (7,), (7, 1, 2, 99),
                             (7, 3, 99), (7, 4, 5, 6, 99)}  # fmt: skip
    assert len(seen) > 3


def test_bart_noise_keeps_the_clean_target():
    noise = BartNoise(prefix="", mask_id=4, pad_id=0, mask_ratio=0.35, poisson_lambda=3.5,
                      permute_sentences=False)  # fmt: skip
    batch = _batch(B=3, L=20)
    batch["attention_mask"][0, 12:] = False
    clean = batch["input_ids"].clone()
    out = noise(batch, torch.Generator().manual_seed(0))
    assert torch.equal(out["lm_target_ids"], clean)
    assert (out["input_ids"] == 4).any(dim=1).all()
    assert out["input_ids"][:, 0].tolist() == [2, 2, 2]  # [CLS] stays first
    lengths = out["attention_mask"].sum(1)
    ends = out["input_ids"][torch.arange(3), lengths - 1]
    assert ends.tolist() == [int(clean[0, 11]), 3, 3]  # and the last real piece last


def test_seq2seq_mlm_also_masks_the_closing_sep():
    """VLP / UniLM: with seq2seq rows the closing [SEP] is a masking candidate (how writing
    learns to stop); plain MLM never masks it."""
    picked = {}
    for modes in ({}, {"bidirectional": 1, "seq2seq": 1}):
        model = _model({"mlm": {"type": "mlm", "attention_modes": modes, "mask_prob": 0.5}})
        batch, g = _batch(B=64), torch.Generator().manual_seed(0)
        for t in data_transforms(model.cfg, VOCAB):
            batch = t(batch, g)
        picked[bool(modes)] = (batch["mlm_labels"] == 3).sum().item()  # 3: [SEP]
    assert picked[False] == 0 and picked[True] > 10
