"""The token_tagging head: each word's first piece carries its tag through the text plug-in,
the loss over first pieces, predictions per word, the scheme."""

from __future__ import annotations

import pytest
import torch

from mmptm.converters.tagging import tagging_sample
from mmptm.modalities.base import DataContext
from mmptm.modalities.text import TextData
from mmptm.objectives.tagging import TokenTagging, is_bio
from mmptm.tokenizers.sentencepiece import train_tokenizer

SENTENCES = [
    (["Anna", "Karenina", "visited", "Oroboro", "."], ["B-PER", "I-PER", "O", "B-LOC", "O"]),
    (["Zepp", "and", "Clementine"], ["B-PER", "O", "B-PER"]),
]
TAGS = "B-LOC\nB-PER\nI-PER\nO\n"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    corpus = root / "corpus.txt"
    words = " ".join(w for ws, _ in SENTENCES for w in ws)
    corpus.write_text((words + "\nthe cat sat on a mat .\n") * 20)
    # a tiny vocabulary: long words split into several pieces
    return train_tokenizer([corpus], root / "tok", vocab_size=40, model_type="bpe",
                           seed=0, num_threads=1)  # fmt: skip


def _head(tmp_path, **kw) -> TokenTagging:
    vocab = tmp_path / "labels.txt"
    vocab.write_text(TAGS)
    return TokenTagging(TokenTagging.Config(labels=str(vocab), dropout=0.0, **kw), width=8)


def _batch(head, tokenizer, max_len=64):
    need = head.data_needs()["text"]
    cfg = TextData.Config(max_len=max_len, **need.facts)
    plugin = TextData(cfg, views=["text"], context=DataContext(tokenizer=tokenizer))
    samples = [tagging_sample(f"k{i}", w, t, "en", {}) for i, (w, t) in enumerate(SENTENCES)]
    decoded = [plugin.decode({"txt": s["txt"].encode()}, s["json"], None) for s in samples]
    return plugin.collate(decoded)


def _first_pieces(tokenizer, words: list[str]) -> list[int]:
    """Oracle: each word's first piece that holds a character, counting the word pieces of
    the words before it (pieces never cross a space) after [CLS]."""
    out, at = [], 1
    for w in words:
        pieces = [tokenizer.id_to_piece(i) for i in tokenizer.encode(w)]
        out.append(at + next(k for k, p in enumerate(pieces) if p != "▁"))
        at += len(pieces)
    return out


def test_first_piece_of_each_word_carries_its_tag(tmp_path, tokenizer):
    head = _head(tmp_path)
    batch = _batch(head, tokenizer)
    for row, (words, tags) in enumerate(SENTENCES):
        first = _first_pieces(tokenizer, words)
        assert len(batch["input_ids"][row].tolist()) > len(words) + 2  # some words split
        want_word = torch.full_like(batch["word_ids"][row], -1)
        want_tag = torch.full_like(batch["tag_ids"][row], -1)
        want_word[first] = torch.arange(len(words))
        want_tag[first] = torch.tensor([head.labels.index(t) for t in tags])
        assert torch.equal(batch["word_ids"][row], want_word)
        assert torch.equal(batch["tag_ids"][row], want_tag)


def test_loss_is_cross_entropy_at_first_pieces_and_predictions_per_word(tmp_path, tokenizer):
    head = _head(tmp_path)
    batch = _batch(head, tokenizer)
    B, L = batch["input_ids"].shape
    out = type("Out", (), {"hidden": {"text": torch.randn(B, L, 8)}})()
    logits = head.logits(out)
    rows, cols = [], []
    for r, (words, _) in enumerate(SENTENCES):
        for c in _first_pieces(tokenizer, words):
            rows.append(r)
            cols.append(c)
    target = batch["tag_ids"][rows, cols]
    want = torch.nn.functional.cross_entropy(logits[rows, cols], target)
    torch.testing.assert_close(head(out, batch)["loss"], want)
    r, w, t = head.word_predictions(out, batch)
    assert r.tolist() == rows and w.tolist() == [i for ws, _ in SENTENCES
                                                for i in range(len(ws))]  # fmt: skip
    assert t.tolist() == logits[rows, cols].argmax(-1).tolist()
    # a batch without any tag gives 0, not NaN
    empty = {**batch, "tag_ids": torch.full_like(batch["tag_ids"], -1)}
    assert head(out, empty)["loss"].item() == 0.0


def test_truncation_leaves_the_last_words_without_a_first_piece(tmp_path, tokenizer):
    head = _head(tmp_path)
    batch = _batch(head, tokenizer, max_len=5)  # [CLS] + 3 pieces + [SEP]
    kept = batch["word_ids"][0][batch["word_ids"][0] >= 0].tolist()
    assert kept == list(range(len(kept))) and len(kept) < len(SENTENCES[0][0])


def test_scheme_and_vocabulary_checks(tmp_path):
    assert is_bio(["O", "B-PER", "I-PER"]) and is_bio(["S-LOC", "E-LOC", "O"])
    assert not is_bio(["NOUN", "VERB"]) and not is_bio(["O"]) and not is_bio(["B-", "O"])
    assert _head(tmp_path).scheme == "bio"
    pos = tmp_path / "pos.txt"
    pos.write_text("NOUN\nVERB\n")
    tagger = TokenTagging(TokenTagging.Config(labels=str(pos)), width=8)
    assert tagger.scheme == "tags"
    with pytest.raises(ValueError, match="scheme=bio"):
        TokenTagging(TokenTagging.Config(labels=str(pos), scheme="bio"), width=8)
    with pytest.raises(ValueError, match="labels is empty"):
        TokenTagging(TokenTagging.Config(), width=8)
