"""Tests for the shared multilingual sentencepiece tokenizer."""

from __future__ import annotations

import io
import json
import pickle
import random
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm

from mmptm.tokenizers.sentencepiece import SPECIALS, Tokenizer, train_tokenizer

WORDS = {  # space-separated vocabularies
    "en": "the quick brown fox jumps over a lazy dog while [birds] sing (in) spring",
    "de": "der schnelle braune Fuchs springt über einen faulen Hund und Vögel singen",
    "ru": "быстрая коричневая лиса прыгает через ленивую собаку пока птицы поют весной",
    "el": "η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο ενώ τα πουλιά",
}
# Upper-case Latin letters so that "MASK", "CLS" etc. are spelt with known characters.
EXTRA = "ABCDEFGHIJKLMNOPQRSTUVWXYZ [x] [y]"


def make_sentences(lang: str, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(f"{lang}-{seed}")
    words = f"{WORDS[lang]} {EXTRA}".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(n)]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shard(path: Path, *, corrupt_member: bool = False) -> Path:
    """A tiny webdataset shard: captions (en/ru), a parallel pair (de/el) and a txt member."""
    with tarfile.open(path, "w") as tar:
        for i, (en, ru) in enumerate(zip(make_sentences("en", 40), make_sentences("ru", 40))):
            meta = {"captions": {"en": en, "ru": ru}, "id": i}
            add_member(tar, f"cap{i:04d}.json", json.dumps(meta, ensure_ascii=False).encode())
            add_member(tar, f"cap{i:04d}.jpg", b"\xff\xd8 not an image")
        for i, (de, el) in enumerate(zip(make_sentences("de", 40), make_sentences("el", 40))):
            meta = {"languages": ["de", "el"], "texts": [de, el]}
            add_member(tar, f"par{i:04d}.json", json.dumps(meta, ensure_ascii=False).encode())
        add_member(tar, "txt0000.txt", "\n".join(make_sentences("en", 20, seed=1)).encode())
        if corrupt_member:
            add_member(tar, "bad0000.json", b'{"captions": {"en": "unterminated')
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("corpus")
    return [write_lines(root / f"{lang}.txt", make_sentences(lang, 150)) for lang in WORDS]


@pytest.fixture(scope="module")
def tok_prefix(corpus: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "spm"
    train_tokenizer(corpus, out, vocab_size=400, languages=["en", "de", "ru", "el"])
    return out


@pytest.fixture(scope="module")
def tok(tok_prefix: Path) -> Tokenizer:
    return Tokenizer.load(f"{tok_prefix}.model")


def test_train_from_text_files_writes_model_and_sidecar(corpus: list[Path], tmp_path: Path):
    tok = train_tokenizer(corpus, tmp_path / "sub" / "spm", vocab_size=400, languages=["en"])
    assert (tmp_path / "sub" / "spm.model").is_file()
    sidecar = json.loads((tmp_path / "sub" / "spm.json").read_text(encoding="utf-8"))
    assert sidecar == {
        "languages": ["en"],
        "specials": {
            "pad": "[PAD]",
            "unk": "[UNK]",
            "cls": "[CLS]",
            "sep": "[SEP]",
            "mask": "[MASK]",
        },
    }
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sub" / "spm.model"))
    assert tok.vocab_size == sp.get_piece_size()
    assert 100 < tok.vocab_size <= 400
    loaded = Tokenizer.load(tmp_path / "sub" / "spm.model")
    assert loaded.languages == ["en"]
    assert loaded.encode("the quick fox") == tok.encode("the quick fox")


def test_special_ids_fixed_distinct_and_control(tok: Tokenizer):
    assert tok.pad_id == 0
    assert tok.unk_id == 1
    ids = [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id]
    assert len(set(ids)) == 5
    assert [tok.id_to_piece(i) for i in ids] == list(SPECIALS)
    lang_ids = [tok.lang_tag_id(lang) for lang in tok.languages]
    assert tok.special_ids == frozenset(ids + lang_ids)
    assert all(tok.is_special(i) for i in ids + lang_ids)
    assert not tok.is_special(tok.encode("fox")[-1])
    # Nothing was appended: our specials are real pieces of the trained model.
    assert max(tok.special_ids) < tok.vocab_size


@pytest.mark.parametrize(
    "text",
    ["[MASK]", "the [MASK] fox [CLS] jumps [SEP]", "[PAD] [UNK] [en] [ru] лиса [MASK]"],
)
def test_encode_never_produces_specials(tok: Tokenizer, text: str):
    ids = tok.encode(text)
    assert ids
    assert not set(ids) & tok.special_ids
    assert tok.decode(ids) == text


@pytest.mark.parametrize(
    "text",
    [
        "the quick brown fox jumps over a lazy dog",
        "der schnelle braune Fuchs springt über einen faulen Hund",
        "быстрая коричневая лиса прыгает через ленивую собаку",
        "η γρήγορη καφέ αλεπού πηδά",
    ],
)
def test_encode_decode_round_trip(tok: Tokenizer, text: str):
    ids = tok.encode(text)
    assert all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text
    # decode drops specials, so a model input decodes back to the text.
    assert tok.decode(tok.build_inputs(ids)[0]) == text


def test_languages_and_lang_index(tok: Tokenizer):
    assert tok.languages == ["en", "de", "ru", "el"]
    assert [tok.lang_index(lang) for lang in ["en", "de", "ru", "el"]] == [0, 1, 2, 3]
    assert [tok.id_to_piece(tok.lang_tag_id(lang)) for lang in tok.languages] == [
        "[en]",
        "[de]",
        "[ru]",
        "[el]",
    ]
    with pytest.raises(ValueError, match=r"'fr'.*\['en', 'de', 'ru', 'el'\]"):
        tok.lang_index("fr")
    with pytest.raises(ValueError, match="'fr'"):
        tok.lang_tag_id("fr")


def test_build_inputs_layout_and_segments(tok: Tokenizer):
    cls, sep = tok.cls_id, tok.sep_id
    ids, seg = tok.build_inputs([10, 11, 12])
    assert ids == [cls, 10, 11, 12, sep]
    assert seg == [0, 0, 0, 0, 0]
    ids, seg = tok.build_inputs([10, 11], [20, 21, 22])
    assert ids == [cls, 10, 11, sep, 20, 21, 22, sep]
    assert seg == [0, 0, 0, 0, 1, 1, 1, 1]
    ids, seg = tok.build_inputs([], [])
    assert ids == [cls, sep, sep]
    assert seg == [0, 0, 1]


def test_build_inputs_truncation(tok: Tokenizer):
    cls, sep = tok.cls_id, tok.sep_id
    a, b = list(range(100, 110)), list(range(200, 203))
    # Longer side first: 10 + 3 must fit 8 - 3 = 5 -> a cut to 3, then one more each side.
    ids, seg = tok.build_inputs(a, b, max_len=8)
    assert ids == [cls, 100, 101, 102, sep, 200, 201, sep]
    assert seg == [0, 0, 0, 0, 0, 1, 1, 1]
    ids, _ = tok.build_inputs(b, a, max_len=9)
    assert ids == [cls, 200, 201, 202, sep, 100, 101, 102, sep]
    # Only the longer side shrinks while the shorter one still fits untouched.
    ids, _ = tok.build_inputs(a, b, max_len=12)
    assert ids == [cls, *a[:6], sep, *b, sep]
    ids, seg = tok.build_inputs(a, max_len=5)
    assert ids == [cls, 100, 101, 102, sep]
    assert len(seg) == 5
    for max_len in range(3, 20):
        ids, seg = tok.build_inputs(a, b, max_len=max_len)
        assert len(ids) == len(seg) == min(max_len, len(a) + len(b) + 3)
        assert ids.count(sep) == 2
    with pytest.raises(ValueError, match="max_len"):
        tok.build_inputs([1], max_len=2)


def test_train_from_shard_collects_languages(tmp_path: Path):
    (tmp_path / "shards").mkdir()
    shard = write_shard(tmp_path / "shards" / "shard-000.tar")
    tok = train_tokenizer([shard], tmp_path / "spm", vocab_size=300)
    assert tok.languages == ["de", "el", "en", "ru"]
    assert tok.lang_index("el") == 1
    assert tok.id_to_piece(tok.lang_tag_id("ru")) == "[ru]"
    for text in ["лиса прыгает", "καφέ αλεπού", "über den Hund", "lazy dog"]:
        assert tok.decode(tok.encode(text)) == text
    # A directory and a glob pattern of shards give the same model.
    by_dir = train_tokenizer([tmp_path / "shards"], tmp_path / "d", vocab_size=300)
    by_glob = train_tokenizer([str(tmp_path / "shards" / "*.tar")], tmp_path / "g", vocab_size=300)
    model = (tmp_path / "spm.model").read_bytes()
    assert (tmp_path / "d.model").read_bytes() == model
    assert (tmp_path / "g.model").read_bytes() == model
    assert by_dir.languages == by_glob.languages == tok.languages


def test_corrupt_shard_member_warns_and_is_skipped(tmp_path: Path):
    shard = write_shard(tmp_path / "bad.tar", corrupt_member=True)
    with pytest.warns(UserWarning, match=r"skipped 1 .*'bad0000' in .*bad\.tar: JSONDecodeError"):
        tok = train_tokenizer([shard], tmp_path / "spm", vocab_size=300)
    assert tok.languages == ["de", "el", "en", "ru"]


def test_truncated_shard_warns_and_keeps_what_came_before(tmp_path: Path):
    data = write_shard(tmp_path / "full.tar").read_bytes()
    # Cut inside the parallel-text members: captions (en/ru) come first and survive.
    (tmp_path / "trunc.tar").write_bytes(data[: len(data) * 2 // 3 + 100])
    with pytest.warns(UserWarning, match=r"skipped 1 .*trunc\.tar: ReadError: unexpected end"):
        tok = train_tokenizer([tmp_path / "trunc.tar"], tmp_path / "spm", vocab_size=300)
    assert {"en", "ru"} <= set(tok.languages)
    assert tok.decode(tok.encode("лиса прыгает")) == "лиса прыгает"


def test_training_is_deterministic(corpus: list[Path], tmp_path: Path):
    # Subsampling on (max_sentences < corpus) so the sampler's seeding is exercised too.
    kwargs = {"vocab_size": 300, "max_sentences": 400, "seed": 3}
    train_tokenizer(corpus, tmp_path / "a", **kwargs)
    train_tokenizer(corpus, tmp_path / "b", **kwargs)
    # A fresh process: in-process repeats can hide generator state seeded once per process.
    code = (
        "import sys; from mmptm.tokenizers.sentencepiece import train_tokenizer; "
        f"train_tokenizer(sys.argv[2:], sys.argv[1], **{kwargs!r})"
    )
    cmd = [sys.executable, "-c", code, str(tmp_path / "c"), *map(str, corpus)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    a = (tmp_path / "a.model").read_bytes()
    assert (tmp_path / "b.model").read_bytes() == a
    assert (tmp_path / "c.model").read_bytes() == a
    assert (tmp_path / "c.json").read_bytes() == (tmp_path / "a.json").read_bytes()


def test_pickle_round_trip(tok: Tokenizer):
    clone = pickle.loads(pickle.dumps(tok))
    texts = ["the lazy dog", "ленивую собаку", "[MASK] über", "η γρήγορη"]
    assert [clone.encode(t) for t in texts] == [tok.encode(t) for t in texts]
    assert clone.languages == tok.languages
    assert clone.special_ids == tok.special_ids
    assert (clone.pad_id, clone.cls_id, clone.sep_id, clone.mask_id, clone.vocab_size) == (
        tok.pad_id,
        tok.cls_id,
        tok.sep_id,
        tok.mask_id,
        tok.vocab_size,
    )


def test_load_without_sidecar_recovers_language_tags(
    tok: Tokenizer, tok_prefix: Path, tmp_path: Path
):
    path = tmp_path / "bare.model"
    path.write_bytes(Path(f"{tok_prefix}.model").read_bytes())
    bare = Tokenizer.load(path)
    assert bare.languages == tok.languages
    assert bare.mask_id == tok.mask_id
    assert bare.vocab_size == tok.vocab_size


def test_foreign_xlmr_style_model(corpus: list[Path], tmp_path: Path):
    prefix = tmp_path / "xlmr"
    spm.SentencePieceTrainer.train(
        input=",".join(map(str, corpus)),
        model_prefix=str(prefix),
        vocab_size=200,
        hard_vocab_limit=False,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=f"{prefix}.model")
    n = sp.get_piece_size()
    tok = Tokenizer.load(f"{prefix}.model")
    assert tok.languages == []
    assert tok.cls_id == sp.piece_to_id("<s>") == 1
    assert tok.sep_id == sp.piece_to_id("</s>") == 2
    assert tok.pad_id == sp.piece_to_id("<pad>") == 3
    assert tok.unk_id == sp.unk_id() == 0
    assert tok.mask_id == n
    assert tok.vocab_size == n + 1
    assert tok.id_to_piece(tok.mask_id) == "[MASK]"
    assert tok.special_ids == frozenset({0, 1, 2, 3, n})
    text = "the lazy dog"
    ids = tok.encode(text)
    assert ids == sp.encode(text)
    input_ids, _ = tok.build_inputs(ids, [tok.mask_id])
    assert tok.decode(input_ids) == text
    clone = pickle.loads(pickle.dumps(tok))
    assert (clone.mask_id, clone.vocab_size) == (n, n + 1)


def test_missing_paths_are_named(tmp_path: Path):
    missing = tmp_path / "nope.model"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        Tokenizer.load(missing)
    present = write_lines(tmp_path / "a.txt", make_sentences("en", 5))
    missing_txt = tmp_path / "missing.txt"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing_txt))):
        train_tokenizer([present, missing_txt], tmp_path / "spm")
    with pytest.raises(FileNotFoundError, match=r"shard-\*\.tar"):
        train_tokenizer([str(tmp_path / "shard-*.tar")], tmp_path / "spm")


# -- fairseq (XLM-R) id scheme ------------------------------------------------------------------

XLMR_TEXTS = [
    "the quick brown fox jumps over a lazy dog",
    "быстрая коричневая лиса прыгает через ленивую собаку",
    "der schnelle braune Fuchs springt über einen faulen Hund",
    "η γρήγορη καφέ αλεπού πηδά",
    "  extra   spaces and 漢字 unknown ✓ characters ",
]


def train_xlmr_spm(corpus: list[Path], out: Path, **kwargs: Any) -> Path:
    """A sentencepiece model laid out like XLM-R's: <unk>=0, <s>=1, </s>=2, no <pad>."""
    options = {"vocab_size": 300, "unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1, **kwargs}
    spm.SentencePieceTrainer.train(
        input=",".join(map(str, corpus)),
        model_prefix=str(out),
        hard_vocab_limit=False,
        character_coverage=1.0,
        minloglevel=2,
        **options,
    )
    return Path(f"{out}.model")


def hf_xlmr_tokenizer(spm_path: Path):
    """HF's XLMRobertaTokenizer over ``spm_path``'s pieces, as its XLMRobertaConverter builds it.

    ``XLMRobertaTokenizer.from_pretrained`` would do this itself but needs protobuf to read the
    .model file; the vocabulary (fairseq specials, pieces 3.., <mask>) and scores are the same.
    """
    transformers = pytest.importorskip("transformers")
    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(sp.id_to_piece(i), sp.get_score(i)) for i in range(3, sp.get_piece_size())]
    vocab.append(("<mask>", 0.0))
    return transformers.XLMRobertaTokenizer(vocab=vocab)


@pytest.fixture(scope="module")
def xlmr_spm(corpus: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    # nmt_nfkc is the identity on XLMR_TEXTS, so HF needs no precompiled charsmap to agree.
    return train_xlmr_spm(corpus, tmp_path_factory.mktemp("xlmr") / "sentencepiece.bpe")


def test_fairseq_scheme_ids_and_specials(xlmr_spm: Path):
    sp = spm.SentencePieceProcessor(model_file=str(xlmr_spm))
    n = sp.get_piece_size()
    tok = Tokenizer.from_xlmr(xlmr_spm)
    assert tok.id_scheme == "fairseq"
    assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.mask_id == n + 1
    assert tok.vocab_size == n + 2
    assert [tok.id_to_piece(i) for i in (0, 1, 2, 3, n + 1)] == [
        "<s>",
        "<pad>",
        "</s>",
        "<unk>",
        "<mask>",
    ]
    assert tok.special_ids == frozenset({0, 1, 2, 3, n + 1})
    for text in XLMR_TEXTS:
        # The documented scheme: sentencepiece id + 1, except the model's <unk> (0) -> 3.
        expected = [i + 1 if i != sp.unk_id() else 3 for i in sp.encode(text)]
        assert tok.encode(text) == expected
        assert tok.build_inputs(tok.encode(text))[0] == [0, *expected[:62], 2]
    assert 3 in tok.encode("漢字")
    ids = tok.encode("the lazy dog")
    assert tok.id_to_piece(ids[-1]) == sp.id_to_piece(ids[-1] - 1)
    assert tok.decode(tok.build_inputs(ids)[0]) == "the lazy dog"


def test_fairseq_scheme_matches_hf_xlmr_tokenizer(xlmr_spm: Path):
    hf = hf_xlmr_tokenizer(xlmr_spm)
    tok = Tokenizer.from_xlmr(xlmr_spm.parent)  # a directory holding sentencepiece.bpe.model
    assert (tok.mask_id, tok.vocab_size) == (hf.mask_token_id, len(hf))
    for text in XLMR_TEXTS:
        ids, _ = tok.build_inputs(tok.encode(text), max_len=512)
        assert ids == hf(text)["input_ids"], text


def test_fairseq_scheme_save_load_and_pickle(xlmr_spm: Path, tmp_path: Path):
    tok = Tokenizer.from_xlmr(xlmr_spm)
    path = tok.save(tmp_path / "tokenizer")
    assert path == tmp_path / "tokenizer.model"
    sidecar = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert sidecar == {"languages": [], "id_scheme": "fairseq"}
    for clone in (Tokenizer.load(path), pickle.loads(pickle.dumps(tok))):
        assert clone.id_scheme == "fairseq"
        assert clone.special_ids == tok.special_ids
        assert [clone.encode(t) for t in XLMR_TEXTS] == [tok.encode(t) for t in XLMR_TEXTS]
    # Without the sidecar the same file is read in the sentencepiece scheme.
    bare = tmp_path / "bare.model"
    bare.write_bytes(xlmr_spm.read_bytes())
    assert Tokenizer.load(bare).id_scheme == "sentencepiece"
    (tmp_path / "bad.model").write_bytes(xlmr_spm.read_bytes())
    (tmp_path / "bad.json").write_text('{"id_scheme": "gpt2"}', encoding="utf-8")
    with pytest.raises(ValueError, match="id_scheme"):
        Tokenizer.load(tmp_path / "bad.model")


def test_fairseq_scheme_rejects_foreign_layouts(corpus: list[Path], tmp_path: Path):
    # Text pieces at ids 1-2 would collide with fairseq's <pad> and </s> once shifted.
    path = train_xlmr_spm(corpus, tmp_path / "nobos", vocab_size=200, bos_id=-1, eos_id=-1)
    with pytest.raises(ValueError, match="piece 1 is the text piece"):
        Tokenizer(path.read_bytes(), id_scheme="fairseq")
    with pytest.raises(ValueError, match="fixed specials"):
        Tokenizer(path.read_bytes(), id_scheme="fairseq", specials={"mask": "[MASK]"})
    with pytest.raises(ValueError, match="unknown id_scheme"):
        Tokenizer(path.read_bytes(), id_scheme="bert")
    with pytest.raises(FileNotFoundError, match="sentencepiece.bpe.model"):
        Tokenizer.from_xlmr(tmp_path)


def test_short_vocabulary_warns_and_bpe_reaches_whole_words(tmp_path: Path, caplog):
    # Few word types, as in toyworld: unigram stops far short of the size asked and the
    # warning says so; BPE at a size the corpus can fill keeps the words whole, silently.
    rng = random.Random(0)
    words = ["маленький", "зелёный", "ромб", "находится", "над", "большим", "жёлтым", "квадратом"]
    lines = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(3000)]
    corpus = write_lines(tmp_path / "ru.txt", lines)
    with caplog.at_level("WARNING", logger="mmptm.tokenizers.sentencepiece"):
        uni = train_tokenizer([corpus], tmp_path / "uni", vocab_size=2000, languages=["ru"])
    assert uni.vocab_size < 1000
    assert any("pieces of the 2000 asked" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level("WARNING", logger="mmptm.tokenizers.sentencepiece"):
        bpe = train_tokenizer(
            [corpus], tmp_path / "bpe", vocab_size=120, languages=["ru"], model_type="bpe"
        )
    assert not caplog.records
    assert [bpe.id_to_piece(i) for i in bpe.encode("маленький квадратом")] == [
        "▁маленький",
        "▁квадратом",
    ]


def test_fit_to_data_sizes_bpe_to_the_captions_with_whole_words(
    tiny_world, tmp_path, caplog, capfd
):
    # The VQA study's tokenizer: English captions and questions (about 50 word types) cannot
    # fill 1000 pieces. Unigram stops near letter level with a warning; BPE fitted to the
    # data stops when every word is one piece, with no warning (ours or sentencepiece's).
    shards = [tiny_world / "text" / "en.txt", *sorted(tiny_world.glob("vqa/train-*.tar"))]
    with caplog.at_level("INFO", logger="mmptm.tokenizers.sentencepiece"):
        tok = train_tokenizer(shards, tmp_path / "bpe", vocab_size=1000, languages=["en"],
                              model_type="bpe", num_threads=1, fit_to_data=True)  # fmt: skip
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert "warn" not in capfd.readouterr().err.lower()
    assert 100 < tok.vocab_size < 1000
    assert any("every one of" in r.getMessage() for r in caplog.records)
    sentence = "What color is the large triangle to the left of the small star?"
    words = [tok.id_to_piece(i) for i in tok.encode(sentence)]
    assert words == ["\u2581" + w for w in sentence[:-1].split()] + ["?"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="mmptm.tokenizers.sentencepiece"):
        uni = train_tokenizer(shards, tmp_path / "uni", vocab_size=1000, languages=["en"],
                              num_threads=1)  # fmt: skip
    assert uni.vocab_size < 200 and any("pieces of the 1000" in r.getMessage()
                                        for r in caplog.records)  # fmt: skip
    with pytest.raises(ValueError, match="fit_to_data needs model_type='bpe'"):
        train_tokenizer(shards, tmp_path / "x", vocab_size=1000, fit_to_data=True)


def test_fit_to_data_warns_about_words_left_split(tmp_path: Path, caplog):
    # sentencepiece caps pieces at 16 characters: a longer word stays in pieces
    corpus = write_lines(tmp_path / "long.txt", ["a supercalifragilisticexpialidocious day"] * 50)
    with caplog.at_level("WARNING", logger="mmptm.tokenizers.sentencepiece"):
        train_tokenizer([corpus], tmp_path / "bpe", vocab_size=500, languages=["en"],
                        model_type="bpe", fit_to_data=True)  # fmt: skip
    assert any("1 of 3 words still split (e.g. supercalifragilisticexpialidocious)"
               in r.getMessage() for r in caplog.records)  # fmt: skip


@pytest.mark.parametrize("scheme", ["sentencepiece", "fairseq"])
def test_word_start_ids_mark_the_first_piece_of_every_word(
    tok: Tokenizer, xlmr_spm: Path, scheme: str
):
    t = tok if scheme == "sentencepiece" else Tokenizer.from_xlmr(xlmr_spm)
    assert not (t.word_start_ids & t.special_ids)
    for text in [*make_sentences("en", 30, seed=5), *make_sentences("ru", 30, seed=5)]:
        words = text.split()
        # Independent of the piece spelling: each word encoded alone starts a word, and the
        # sentence has exactly one word-start piece per word.
        for w in words:
            first, *rest = t.encode(w)
            assert first in t.word_start_ids, w
            assert not set(rest) & t.word_start_ids, w
        n_starts = sum(i in t.word_start_ids for i in t.encode(text))
        assert n_starts == len(words), text
