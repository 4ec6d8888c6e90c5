"""ERNIE 1.0's phrase-level masking: the chunker checked by brute force, phrases masked whole."""

from __future__ import annotations

import pytest
import torch

from mmptm.encoders.base import VocabInfo
from mmptm.objectives.mlm import IGNORE, MaskedLM, chunk_words

SPECIALS = frozenset({0, 1, 2, 3, 4})
STARTS = frozenset(range(5, 500))  # ids 5..499 begin a word, 500..999 continue one
ENDS = frozenset({7})  # "." ends a sentence
VOCAB = VocabInfo(vocab_size=1000, pad_id=0, mask_id=4, cls_id=2, sep_id=3,
                  special_ids=SPECIALS, word_starts=STARTS, sentence_ends=ENDS)  # fmt: skip
W_STARTS, W_ENDS = torch.tensor(sorted(STARTS)), torch.tensor(sorted(ENDS))


def _text(B: int, L: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 1000, (B, L), generator=g)
    ids[torch.rand(B, L, generator=g) < 0.08] = 7
    ids[:, 0], ids[:, -1] = 2, 3
    real = torch.arange(L)[None, :] < torch.randint(L // 2, L + 1, (B,), generator=g)[:, None]
    return ids, real


def _words(ids: list[int], cand: list[bool]) -> list[list[int]]:
    """Brute force: the positions of each word (a start piece or a piece after a non-text one,
    with the continuation pieces after it)."""
    words: list[list[int]] = []
    for t, (i, c) in enumerate(zip(ids, cand)):
        if not c:
            continue
        if i in STARTS or t == 0 or not cand[t - 1]:
            words.append([t])
        else:
            words[-1].append(t)
    return words


def test_chunks_are_whole_words_up_to_n_and_never_cross_a_sentence_end() -> None:
    ids, real = _text(64, 40, 0)
    cand = real & ~torch.isin(ids, torch.tensor(sorted(SPECIALS)))
    ch = chunk_words(ids, cand, torch.Generator().manual_seed(1), words=3,
                     word_starts=W_STARTS, sentence_ends=W_ENDS)  # fmt: skip
    sizes = []
    for b in range(64):
        row, c = ids[b].tolist(), cand[b].tolist()
        assert all(ch[b, t] == 0 for t in range(40) if not c[t])
        chunk_of_word = [ch[b, w[0]].item() for w in _words(row, c)]
        for w in _words(row, c):  # a word lies in one chunk
            assert len({ch[b, t].item() for t in w}) == 1
        for k in set(chunk_of_word):
            members = [i for i, x in enumerate(chunk_of_word) if x == k]
            assert members == list(range(members[0], members[-1] + 1))  # contiguous
            sizes.append(len(members))
            assert len(members) <= 3
            words = _words(row, c)
            for m in members[:-1]:  # only a chunk's last word may end a sentence
                assert row[words[m][-1]] != 7
    assert max(sizes) == 3 and min(sizes) == 1


def test_one_word_chunks_are_the_words() -> None:
    ids, real = _text(8, 30, 2)
    cand = real & ~torch.isin(ids, torch.tensor(sorted(SPECIALS)))
    ch = chunk_words(ids, cand, torch.Generator(), words=1,
                     word_starts=W_STARTS, sentence_ends=W_ENDS)  # fmt: skip
    for b in range(8):
        words = _words(ids[b].tolist(), cand[b].tolist())
        assert [ch[b, w[0]].item() for w in words] == list(range(1, len(words) + 1))


def test_chunk_phrases_are_masked_whole_at_their_rate() -> None:
    ids, real = _text(512, 48, 3)
    t = MaskedLM.data_transform(
        MaskedLM.Config(mask_prob=1e-6, mask_phrases="chunk", phrase_mask_prob=0.3), VOCAB
    )
    assert t.word_starts is None  # chunking alone does not turn on whole-word masking
    batch = {"input_ids": ids.clone(), "attention_mask": real}
    out = t(batch, torch.Generator().manual_seed(4))
    sel = out["mlm_labels"] != IGNORE
    cand = real & ~torch.isin(ids, torch.tensor(sorted(SPECIALS)))
    assert not bool((sel & ~cand).any())
    assert torch.equal(out["mlm_labels"][sel], ids[sel])
    # masked words come in runs of whole words: every selected word is wholly selected
    n_words = n_sel = 0
    for b in range(512):
        for w in _words(ids[b].tolist(), cand[b].tolist()):
            s = {bool(sel[b, t]) for t in w}
            assert len(s) == 1
            n_words += 1
            n_sel += s.pop()
    assert abs(n_sel / n_words - 0.3) < 0.03  # a chunk drawn with 0.3 takes all its words


def _phrased_batch(B: int = 600, L: int = 32):
    ids = torch.randint(5, 1000, (B, L), generator=torch.Generator().manual_seed(5))
    first, inside, which = torch.full((B, L), -1), torch.zeros(B, L, dtype=torch.bool), {}
    for start, length in ((2, 3), (5, 2), (12, 4)):  # (2, 3) and (5, 2) touch
        first[:, start] = 0
        inside[:, start : start + length] = True
        which[start] = length
    return {"input_ids": ids, "phrase_ids": first, "phrase_mask": inside}, which


def test_annotated_phrases_are_masked_whole_and_keep_their_ids() -> None:
    batch, which = _phrased_batch()
    before = {k: v.clone() for k, v in batch.items()}
    t = MaskedLM.data_transform(
        MaskedLM.Config(mask_prob=1e-6, mask_phrases="phrase", phrase_mask_prob=0.4), VOCAB
    )
    out = t(batch, torch.Generator().manual_seed(6))
    sel = out["mlm_labels"] != IGNORE
    assert not bool((sel & ~before["phrase_mask"]).any())
    for start, length in which.items():
        part = sel[:, start : start + length]
        assert bool((part.all(1) | ~part.any(1)).all())  # in or out as a whole
        assert abs(part[:, 0].float().mean().item() - 0.4) < 0.06
    assert torch.equal(out["phrase_ids"], before["phrase_ids"])  # phrases name no entity


def test_phrase_and_entity_masking_combine() -> None:
    batch, _ = _phrased_batch()
    batch["entity_ids"] = torch.full_like(batch["phrase_ids"], -1)
    batch["entity_ids"][:, 20] = 9
    batch["entity_mask"] = torch.zeros_like(batch["phrase_mask"])
    batch["entity_mask"][:, 20:22] = True
    cfg = MaskedLM.Config(mask_prob=1e-6, mask_spans="entity", span_mask_prob=0.5,
                          mask_phrases="phrase", phrase_mask_prob=0.5)  # fmt: skip
    out = MaskedLM.data_transform(cfg, VOCAB)(batch, torch.Generator().manual_seed(7))
    sel = out["mlm_labels"] != IGNORE
    assert 0.4 < sel[:, 20].float().mean().item() < 0.6
    assert 0.4 < sel[:, 2].float().mean().item() < 0.6
    assert bool((out["entity_ids"][sel[:, 20], 20] == -1).all())


def test_phrase_masking_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="phrase_mask_prob"):
        MaskedLM.data_transform(MaskedLM.Config(mask_phrases="chunk", phrase_mask_prob=0), VOCAB)
    with pytest.raises(ValueError, match="phrase_words"):
        MaskedLM.data_transform(MaskedLM.Config(mask_phrases="chunk", phrase_words=0), VOCAB)
    with pytest.raises(ValueError, match="mask_phrases=chunk needs"):
        MaskedLM.data_transform(
            MaskedLM.Config(mask_phrases="chunk"), VocabInfo(vocab_size=10, special_ids=SPECIALS)
        )
    with pytest.raises(ValueError, match="same annotation"):
        MaskedLM.data_transform(MaskedLM.Config(mask_phrases="e", mask_spans="e"), VOCAB)
    t = MaskedLM.data_transform(MaskedLM.Config(mask_phrases="phrase"), VOCAB)
    with pytest.raises(ValueError, match="mask_phrases='phrase'.*phrase_mask"):
        t({"input_ids": torch.randint(5, 99, (2, 6))}, torch.Generator())
