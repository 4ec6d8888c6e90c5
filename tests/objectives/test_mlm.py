"""MLM: masking statistics and invariants (data side); tied, masked-only loss (loss side)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mmptm.encoders.base import VocabInfo
from mmptm.encoders.text import TextEncoder
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.mlm import IGNORE, MaskedLM, MaskTokens, mask_tokens

SPECIALS = frozenset({0, 1, 2, 3, 4})
VOCAB = VocabInfo(vocab_size=1000, pad_id=0, mask_id=4, cls_id=2, sep_id=3, special_ids=SPECIALS)


def _big_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """256×128 ids with specials sprinkled in and padded tails holding non-special ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (256, 128), generator=g)
    ids[:, 0] = 2  # CLS
    ids[torch.rand(256, 128, generator=g) < 0.05] = 3  # extra specials
    lengths = torch.randint(64, 129, (256,), generator=g)
    real = torch.arange(128)[None, :] < lengths[:, None]
    return ids, real


def _transform(**cfg) -> MaskTokens:
    return MaskedLM.data_transform(MaskedLM.Config(**cfg), VOCAB)


def test_mask_tokens_statistics() -> None:
    ids, real = _big_batch()
    batch = {"input_ids": ids.clone(), "attention_mask": real.clone()}
    out = _transform()(batch, torch.Generator().manual_seed(1))
    inputs, labels = out["input_ids"], out["mlm_labels"]

    special = torch.isin(ids, torch.tensor(sorted(SPECIALS)))
    eligible = real & ~special
    selected = labels != IGNORE
    assert int(eligible.sum()) > 20000
    # never outside the eligible positions: no specials, no padding
    assert not bool((selected & ~eligible).any())
    assert not bool((selected & special).any())
    assert not bool((selected & ~real).any())
    frac = selected.sum().item() / eligible.sum().item()
    assert abs(frac - 0.15) < 0.01, frac

    # labels: the original id where selected, IGNORE elsewhere
    assert torch.equal(labels[selected], ids[selected])
    assert bool((labels[~selected] == IGNORE).all())
    # unselected inputs are untouched
    assert torch.equal(inputs[~selected], ids[~selected])

    n = selected.sum().item()
    sel_in, sel_orig = inputs[selected], ids[selected]
    is_mask = sel_in == VOCAB.mask_id
    unchanged = sel_in == sel_orig
    is_random = ~is_mask & ~unchanged
    # a random draw equals the original with p = 1/995: at most ~0.01% moves from random
    # to unchanged, far inside the tolerance
    assert abs(is_mask.sum().item() / n - 0.8) < 0.02
    assert abs(is_random.sum().item() / n - 0.1) < 0.02
    assert abs(unchanged.sum().item() / n - 0.1) < 0.02
    # random replacements never draw a special token
    assert not bool(torch.isin(sel_in[is_random], torch.tensor(sorted(SPECIALS))).any())
    # and they are spread over the vocabulary, not one id
    assert sel_in[is_random].unique().numel() > 100


def test_mask_tokens_custom_probabilities() -> None:
    ids, real = _big_batch(seed=3)
    pool = torch.arange(5, 1000)
    inputs, labels = mask_tokens(
        ids,
        real,
        torch.Generator().manual_seed(0),
        mask_prob=0.4,
        p_mask=0.5,
        p_random=0.0,
        mask_id=4,
        special_ids=torch.tensor([0, 1, 2, 3, 4]),
        random_pool=pool,
    )
    eligible = real & (ids > 4)
    selected = labels != IGNORE
    assert abs(selected.sum().item() / eligible.sum().item() - 0.4) < 0.01
    sel_in = inputs[selected]
    assert abs((sel_in == 4).float().mean().item() - 0.5) < 0.02
    # p_random=0: every selected token is either [MASK] or itself
    assert bool(((sel_in == 4) | (sel_in == ids[selected])).all())


def test_mask_tokens_is_seeded() -> None:
    ids, real = _big_batch()
    t = _transform()

    def run(seed: int):
        out = t(
            {"input_ids": ids.clone(), "attention_mask": real}, torch.Generator().manual_seed(seed)
        )
        return out["input_ids"], out["mlm_labels"]

    a_in, a_lab = run(7)
    b_in, b_lab = run(7)
    c_in, c_lab = run(8)
    assert torch.equal(a_in, b_in) and torch.equal(a_lab, b_lab)
    assert not torch.equal(a_lab, c_lab)
    assert not torch.equal(a_in, c_in)


def test_mask_tokens_without_attention_mask_treats_all_as_real() -> None:
    ids = torch.randint(5, 1000, (64, 64), generator=torch.Generator().manual_seed(0))
    out = _transform(mask_prob=0.5)({"input_ids": ids.clone()}, torch.Generator().manual_seed(0))
    frac = (out["mlm_labels"] != IGNORE).float().mean().item()
    assert abs(frac - 0.5) < 0.03


def test_itm_negatives_get_no_mlm_labels() -> None:
    ids, real = _big_batch()
    ids, real = ids[:64], real[:64]
    itm = (torch.arange(64) % 3 != 0).long()  # every third sample is a negative
    batch = {"input_ids": ids.clone(), "attention_mask": real, "itm_labels": itm}
    out = _transform(mask_prob=0.3)(batch, torch.Generator().manual_seed(0))
    labels = out["mlm_labels"]
    neg, pos = itm == 0, itm == 1
    assert bool((labels[neg] == IGNORE).all())
    assert bool((labels[pos] != IGNORE).any(dim=1).all())
    # negatives' text is still masked like the rest (masking gives ITM no hint)
    assert bool((out["input_ids"][neg] == VOCAB.mask_id).any(dim=1).all())


def test_prefixed_modality_uses_prefixed_keys() -> None:
    ids = torch.randint(5, 1000, (8, 32), generator=torch.Generator().manual_seed(0))
    out = _transform(modality="text2")({"text2_input_ids": ids.clone()}, torch.Generator())
    assert "text2_mlm_labels" in out and "mlm_labels" not in out


def _worded_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids built word by word (word starts 5-499, continuations 500-999), with the word
    index of every piece (-1 for specials and padding). After some [SEP]s the text goes on
    with a continuation piece, which must count as a word of its own."""
    g = torch.Generator().manual_seed(seed)
    B, L = 256, 96
    ids = torch.zeros(B, L, dtype=torch.long)
    word = torch.full((B, L), -1)
    real = torch.zeros(B, L, dtype=torch.bool)
    n_words = 0
    for b in range(B):
        row, words = [2], [-1]
        end = int(torch.randint(40, L, (1,), generator=g))
        while len(row) < end:
            if torch.rand(1, generator=g) < 0.08:
                row.append(3)
                words.append(-1)
                first = int(torch.randint(500, 1000, (1,), generator=g))  # orphan continuation
            else:
                first = int(torch.randint(5, 500, (1,), generator=g))
            n_cont = int(torch.randint(0, 4, (1,), generator=g))
            row += [first, *torch.randint(500, 1000, (n_cont,), generator=g).tolist()]
            words += [n_words] * (1 + n_cont)
            n_words += 1
        row, words = row[:end], words[:end]
        ids[b, : len(row)] = torch.tensor(row)
        ids[b, len(row) :] = torch.randint(5, 1000, (L - len(row),), generator=g)  # padding
        word[b, : len(row)] = torch.tensor(words)
        real[b, : len(row)] = True
    return ids, real, word


def test_whole_word_masking_selects_every_piece_of_a_word_or_none() -> None:
    ids, real, word = _worded_batch()
    vocab = VocabInfo(vocab_size=1000, special_ids=SPECIALS, word_starts=frozenset(range(5, 500)))
    t = MaskedLM.data_transform(MaskedLM.Config(whole_word=True, mask_prob=0.3), vocab)
    out = t({"input_ids": ids.clone(), "attention_mask": real}, torch.Generator().manual_seed(0))
    selected = out["mlm_labels"] != IGNORE
    assert not bool((selected & (word < 0)).any())  # never a special or padding
    sel_w = torch.zeros(int(word.max()) + 1)
    n_w = torch.zeros_like(sel_w)
    sel_w.index_add_(0, word[word >= 0], selected[word >= 0].float())
    n_w.index_add_(0, word[word >= 0], torch.ones(int((word >= 0).sum())))
    assert bool(((sel_w == 0) | (sel_w == n_w)).all())  # all pieces of a word or none
    frac_words = (sel_w > 0).float().mean().item()
    assert len(sel_w) > 6000 and abs(frac_words - 0.3) < 0.025, frac_words
    # words of several pieces really occur masked together (the test is not vacuous)
    assert int(((sel_w == n_w) & (n_w >= 3)).sum()) > 200
    # the [MASK]/random/keep choice is per piece, as in BERT's whole-word masking
    sel_in = out["input_ids"][selected]
    assert abs((sel_in == VOCAB.mask_id).float().mean().item() - 0.8) < 0.02
    assert torch.equal(out["mlm_labels"][selected], ids[selected])


def _spanned_batch(seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Rows of 64 non-special ids with spans of 1-3 pieces laid out by hand (two of them
    adjacent), as the text plug-in writes them: ``entity_ids`` at a span's first piece,
    ``entity_mask`` on every piece; and the span index of every piece (-1 outside)."""
    g = torch.Generator().manual_seed(seed)
    B, L = 512, 64
    ids = torch.randint(5, 1000, (B, L), generator=g)
    ents = torch.full((B, L), -1)
    inside = torch.zeros(B, L, dtype=torch.bool)
    which = torch.full((B, L), -1)
    n = 0
    for b in range(B):
        for start, length in ((3, 2), (5, 1), (10, 3), (20, 1)):  # (3, 2) and (5, 1) touch
            ents[b, start] = int(torch.randint(0, 50, (1,), generator=g))
            inside[b, start : start + length] = True
            which[b, start : start + length] = n
            n += 1
    return {"input_ids": ids, "entity_ids": ents, "entity_mask": inside}, which


def test_span_masking_masks_whole_spans_and_removes_their_entity() -> None:
    batch, which = _spanned_batch()
    original = {k: v.clone() for k, v in batch.items()}
    t = _transform(mask_prob=1e-6, mask_spans="entity", span_mask_prob=0.5)
    out = t(batch, torch.Generator().manual_seed(0))
    selected = out["mlm_labels"] != IGNORE
    assert not bool((selected & (which < 0)).any())  # mask_prob ~ 0: only span pieces
    n = int(which.max()) + 1
    sel = torch.zeros(n).index_add_(0, which[which >= 0], selected[which >= 0].float())
    size = torch.zeros(n).index_add_(0, which[which >= 0], torch.ones(int((which >= 0).sum())))
    assert bool(((sel == 0) | (sel == size)).all())  # a span in or out as a whole
    assert abs((sel > 0).float().mean().item() - 0.5) < 0.03
    # a masked span's entity is gone (at its first piece), a kept one's is kept
    first = original["entity_ids"] >= 0
    assert torch.equal(out["entity_ids"][first & selected], torch.full_like(
        out["entity_ids"][first & selected], -1))  # fmt: skip
    kept = first & ~selected
    assert torch.equal(out["entity_ids"][kept], original["entity_ids"][kept])
    assert torch.equal(out["mlm_labels"][selected], original["input_ids"][selected])


def test_span_masking_needs_the_span_annotation() -> None:
    t = _transform(mask_spans="entity")
    ids = torch.randint(5, 1000, (2, 8))
    with pytest.raises(ValueError, match="mask_spans='entity'.*entity_mask"):
        t({"input_ids": ids}, torch.Generator())
    with pytest.raises(ValueError, match="span_mask_prob"):
        _transform(mask_spans="entity", span_mask_prob=0.0)


def test_whole_word_masking_needs_word_start_information() -> None:
    with pytest.raises(ValueError, match="whole_word"):
        _transform(whole_word=True)  # VOCAB has no word starts (e.g. an HF config alone)


@pytest.mark.parametrize(
    "cfg", [{"mask_prob": 0.0}, {"mask_prob": 1.0}, {"replace_with_mask": 0.95}]
)
def test_data_transform_validates_probabilities(cfg) -> None:
    with pytest.raises(ValueError, match="mlm"):
        _transform(**cfg)


# ---------------------------------------------------------------------------------------------
# loss side

D = 16
SMALL = VocabInfo(vocab_size=40, special_ids=SPECIALS)


def _mlm() -> tuple[TextEncoder, MaskedLM]:
    torch.manual_seed(0)
    enc = TextEncoder(TextEncoder.Config(), width=D, vocab=SMALL)
    mlm = MaskedLM(MaskedLM.Config(), width=D, encoders=nn.ModuleDict({"text": enc}))
    with torch.no_grad():  # non-trivial values everywhere the reference reads
        mlm.bias.normal_()
        mlm.transform[2].weight.normal_()
        mlm.transform[2].bias.normal_()
    return enc, mlm


def _fusion_out(h: torch.Tensor) -> FusionOutput:
    mask = torch.ones(h.shape[:2], dtype=torch.bool)
    return FusionOutput({"text": h}, {"text": mask}, {})


def _labels(g: torch.Generator, B: int = 3, L: int = 7) -> torch.Tensor:
    labels = torch.full((B, L), IGNORE)
    sel = torch.rand(B, L, generator=g) < 0.4
    sel[0, 2] = True
    labels[sel] = torch.randint(5, 40, (int(sel.sum()),), generator=g)
    return labels


def _reference_loss(mlm: MaskedLM, word: torch.Tensor, h_MD: torch.Tensor, t_M: torch.Tensor):
    """Linear → exact GELU → LayerNorm → tied decoder → cross-entropy, all by hand in float64."""
    lin, ln = mlm.transform[0], mlm.transform[2]
    x = h_MD.double() @ lin.weight.double().T + lin.bias.double()
    x = 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    x = (x - mu) / torch.sqrt(var + ln.eps) * ln.weight.double() + ln.bias.double()
    logits = x @ word.double().T + mlm.bias.double()
    m = logits.max(-1, keepdim=True).values
    lse = (logits - m).exp().sum(-1).log() + m[:, 0]
    nll = lse - logits[torch.arange(len(t_M)), t_M]
    acc = (logits.argmax(-1) == t_M).double().mean()
    return nll.mean(), acc


def test_output_layer_is_tied_to_word_embeddings() -> None:
    enc, mlm = _mlm()
    assert mlm._word[0] is enc.word
    assert mlm._word[0].weight.data_ptr() == enc.word.weight.data_ptr()
    # the tied matrix is not duplicated into the objective's parameters / state dict
    assert all(p is not enc.word.weight for p in mlm.parameters())
    assert not any("word" in k for k in mlm.state_dict())

    g = torch.Generator().manual_seed(0)
    h = torch.randn(3, 7, D, generator=g, requires_grad=True)  # independent of the embeddings
    before = enc.word.weight.detach().clone()
    loss = mlm(_fusion_out(h), {"mlm_labels": _labels(g)})["loss"]
    loss.backward()
    grad = enc.word.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    opt = torch.optim.SGD([*enc.parameters(), *mlm.parameters()], lr=1.0)
    opt.step()
    assert not torch.equal(enc.word.weight.detach(), before)
    assert mlm._word[0].weight.data_ptr() == enc.word.weight.data_ptr()


def test_logits_only_at_masked_positions_and_loss_matches_reference() -> None:
    enc, mlm = _mlm()
    g = torch.Generator().manual_seed(1)
    h = torch.randn(3, 7, D, generator=g)
    labels = _labels(g)
    sel = labels != IGNORE
    seen: list[torch.Tensor] = []
    original = mlm.logits

    def spy(h_MD: torch.Tensor) -> torch.Tensor:
        seen.append(h_MD.detach().clone())
        return original(h_MD)

    mlm.logits = spy  # instance attribute shadows the method
    with torch.no_grad():
        out = mlm(_fusion_out(h), {"mlm_labels": labels})
    assert len(seen) == 1
    assert seen[0].shape == (int(sel.sum()), D)
    assert int(sel.sum()) < sel.numel()
    torch.testing.assert_close(seen[0], h[sel], rtol=0, atol=0)

    want_loss, want_acc = _reference_loss(mlm, enc.word.weight.detach(), h[sel], labels[sel])
    torch.testing.assert_close(out["loss"].double(), want_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out["acc"].double(), want_acc)


def test_batch_without_masked_positions_gives_zero_loss_and_backpropagates() -> None:
    enc, mlm = _mlm()
    h = torch.randn(2, 5, D, requires_grad=True)
    labels = torch.full((2, 5), IGNORE)
    out = mlm(_fusion_out(h), {"mlm_labels": labels})
    loss = out["loss"]
    assert not torch.isnan(loss) and loss.item() == 0.0
    assert out["acc"].item() == 0.0
    assert loss.requires_grad
    loss.backward()
    assert h.grad is not None and bool((h.grad == 0).all())
    word_grad = enc.word.weight.grad
    assert word_grad is None or bool((word_grad == 0).all())


def test_mlm_needs_a_text_encoder() -> None:
    torch.manual_seed(0)
    enc = TextEncoder(TextEncoder.Config(), width=D, vocab=SMALL)
    with pytest.raises(ValueError, match="'text2'"):
        MaskedLM(MaskedLM.Config(modality="text2"), width=D, encoders=nn.ModuleDict({"text": enc}))
    with pytest.raises(ValueError, match="'image'"):
        MaskedLM(
            MaskedLM.Config(modality="image"),
            width=D,
            encoders=nn.ModuleDict({"text": enc, "image": nn.Linear(2, 2)}),
        )


def test_a_tokenizer_without_mask_token_is_refused():
    clip_like = VocabInfo(vocab_size=100, mask_id=-1, special_ids=frozenset({98, 99}))
    with pytest.raises(ValueError, match="needs a tokenizer with a mask token"):
        MaskedLM.data_transform(MaskedLM.Config(), clip_like)
