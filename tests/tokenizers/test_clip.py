"""CLIP's BPE tokenizer: ids identical to open_clip's over varied text, the interface the text
plug-in reads, loading by file type, and clear errors."""

from __future__ import annotations

import gzip
import pickle
import random
from pathlib import Path

import pytest
import torch

from mmptm.encoders.base import VocabInfo
from mmptm.tokenizers.clip import ClipTokenizer
from mmptm.tokenizers.sentencepiece import Tokenizer, load_tokenizer

open_clip = pytest.importorskip("open_clip")
from open_clip.tokenizer import default_bpe  # noqa: E402

CONTEXT = 77
HANDWRITTEN = [
    "",
    " ",
    "a",
    "A photo of a CAT.",
    "two dogs playing in the snow!!",
    "Héllo   wörld\t\tand\nnew lines",
    "it's, they're, we've, I'm, you'll, he'd, don't, IT'S",
    "3.14159 is pi; 1,000,000 and 2024-11-24",
    "“curly quotes” and ‘single’ — em dash … ellipsis",
    "&amp; &lt;b&gt;bold&lt;/b&gt; &#39;quoted&#39; &amp;amp; double-escaped",
    "Ã©tÃ© mojibake fixed by ftfy",
    "ｆｕｌｌｗｉｄｔｈ ｌｅｔｔｅｒｓ １２３",
    "ﬁnancial ligature ﬂow",
    "漢字とひらがなとカタカナ",
    "한국어 문장입니다",
    "Привет, мир! Ёжик",
    "Γειά σου Κόσμε",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "emoji 😀👍🏽👨‍👩‍👧 flags 🇫🇷",
    "combining e\u0301 and n\u0303",
    "tabs\u00a0nbsp\u3000ideographic space",
    "url https://example.com/a?b=c&d=e#frag",
    "email someone@example.org",
    "#hashtag @mention $100 50% ^caret ~tilde `tick` |pipe| \\back/slash",
    "<html><body>tags stay text</body></html>",
    "ALL CAPS SENTENCE WITH NUMBERS 123 AND SYMBOLS !@#",
    "a" * 300,
    " ".join(["word"] * 100),
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "x1y2z3 a1b2 99problems",
    "...,,,;;;:::!!!???",
    "'s 't 're",
    "zero-width\u200bjoiner\u200d",
    "control\x07chars\x1b",
]
ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    " \t\n.,;:!?'\"-_()[]{}<>/\\@#$%^&*+=~`|"
    "éèêëàâäôöûüçñßøåæœÉÀÇ"
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВ"
    "αβγδεζηθικλμνξοπρστυφχψω"
    "漢字日本語中文한국어ひらがなカタカナ"
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي"
    "אבגדהוזחטיכלמנסעפצקרשת"
    "😀😂👍🏽🎉❤️✨"
    "\u00a0\u2003\u3000\u200b"
    "“”‘’—–…•€£¥©®™°±×÷"
)


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.choice([1, 3, 8, 20, 60, 200])
        words = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 9)))]
        while sum(map(len, words)) < length:
            words.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 9))))
        text = rng.choice([" ", "", "  "]).join(words)
        if rng.random() < 0.2:  # HTML entities, which the cleaning unescapes
            text = text.replace("&", "&amp;").replace("<", "&lt;")
        out.append(text)
    return out


@pytest.fixture(scope="module")
def tok() -> ClipTokenizer:
    return ClipTokenizer.load(default_bpe())


def padded(tok: ClipTokenizer, text: str) -> list[int]:
    ids, segments = tok.build_inputs(tok.encode(text), None, CONTEXT)
    assert segments == [0] * len(ids)
    return ids + [tok.pad_id] * (CONTEXT - len(ids))


def test_ids_equal_open_clip_over_varied_text(tok: ClipTokenizer):
    texts = HANDWRITTEN + random_texts(300)
    want = open_clip.get_tokenizer("ViT-B-32")(texts)  # [N, 77], 0-padded
    got = torch.tensor([padded(tok, t) for t in texts])
    bad = [t for t, g, w in zip(texts, got, want) if not torch.equal(g, w)]
    assert not bad, f"{len(bad)} of {len(texts)} texts differ, e.g. {bad[:3]}"
    # the sample is varied: truncated inputs, empty ones, non-ASCII pieces all occur
    lengths = (want != 0).sum(1)
    assert int(lengths.max()) == CONTEXT and int(lengths.min()) == 2
    assert int(want.max()) == tok.sep_id and int((want > 40_000).sum()) > 100


def test_truncation_keeps_the_end_token(tok: ClipTokenizer):
    ids, _ = tok.build_inputs(tok.encode("a " * 200), None, CONTEXT)
    assert len(ids) == CONTEXT and ids[0] == tok.cls_id and ids[-1] == tok.sep_id
    assert ids.count(tok.sep_id) == 1
    assert tok.build_inputs([], None, 5)[0] == [tok.cls_id, tok.sep_id]


def test_literal_specials_stay_text(tok: ClipTokenizer):
    """The one deliberate difference from open_clip: text never yields a special id, so the
    closing end token is the only one (where the text tower pools)."""
    text = "a <end_of_text> b <start_of_text>"
    ours = tok.encode(text)
    assert not set(ours) & tok.special_ids
    theirs = open_clip.tokenize([text])[0].tolist()
    assert theirs.count(tok.sep_id) == 2  # open_clip maps the literal to the special
    assert tok.decode(ours) == "a < end _ of _ text > b < start _ of _ text >"


def test_interface_the_text_plugin_and_model_read(tok: ClipTokenizer):
    vocab = VocabInfo.from_tokenizer(tok)
    assert (vocab.vocab_size, vocab.pad_id, vocab.cls_id, vocab.sep_id) == (49408, 0, 49406, 49407)
    assert vocab.mask_id == -1 and vocab.special_ids == {49406, 49407}
    assert vocab.pad_is_text and vocab.languages == () and not vocab.word_starts
    assert tok.id_to_piece(0) == "!" and tok.id_to_piece(49407) == "<end_of_text>"
    assert tok.decode(tok.build_inputs(tok.encode("Two  DOGS, running!"))[0]) == (
        "two dogs , running !"
    )
    with pytest.raises(ValueError, match="pairs"):
        tok.build_inputs([1], [2])
    with pytest.raises(ValueError, match="offsets"):
        tok.encode_with_offsets("a cat")
    with pytest.raises(ValueError, match="no languages"):
        tok.lang_index("en")
    with pytest.raises(ValueError, match="outside"):
        tok.id_to_piece(49408)


def test_pickles_for_loader_workers(tok: ClipTokenizer):
    back = pickle.loads(pickle.dumps(tok))
    texts = random_texts(20, seed=1)
    assert [back.encode(t) for t in texts] == [tok.encode(t) for t in texts]


def test_load_tokenizer_dispatches_by_file_type(tmp_path: Path, tok: ClipTokenizer, tiny_world):
    saved = tok.save(tmp_path / "run" / "bpe_simple_vocab_16e6.txt.gz")
    assert saved.read_bytes() == Path(default_bpe()).read_bytes()
    loaded = load_tokenizer(saved)
    assert isinstance(loaded, ClipTokenizer) and loaded.encode("a cat") == tok.encode("a cat")
    assert isinstance(load_tokenizer(tiny_world / "tokenizer.model"), Tokenizer)


def test_bad_merges_files_are_named(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="missing"):
        ClipTokenizer.load(tmp_path / "missing.txt.gz")
    plain = tmp_path / "plain.txt.gz"
    plain.write_text("not gzipped")
    with pytest.raises(ValueError, match="plain.txt.gz: not a gzipped"):
        ClipTokenizer.load(plain)
    broken = tmp_path / "broken.txt.gz"
    broken.write_bytes(gzip.compress(b"#version: 0.2\ni n\nthree parts here\n"))
    with pytest.raises(ValueError, match="broken.txt.gz line 3"):
        ClipTokenizer.load(broken)
