"""The text plug-in: segments per sample format, pair packing (TLM join, stacking), character
spans mapped onto tokens, and the tokenizer's sentences."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch

from mmptm.config import ConfigError, from_dict
from mmptm.data.pipeline import ShardStream, stream_config
from mmptm.data.shards import ShardWriter
from mmptm.encoders.base import VocabInfo
from mmptm.modalities import DataContext, Need
from mmptm.modalities.sentences import Segment, sample_texts, segments
from mmptm.modalities.text import PackPairs, TextData
from mmptm.objectives.mlm import IGNORE, MaskedLM
from mmptm.recipe import DataConfig, SourceConfig


class _Tok:
    """Just what collation needs: the pad id and the language list."""

    pad_id = 0
    languages = ("en", "de", "fr")


TOK = _Tok()


def _text(tok=TOK, views=("text",), pairs=None, **cfg) -> TextData:
    context = DataContext(tokenizer=tok, pairs=pairs or {})
    return TextData(TextData.Config(**cfg), views=list(views), context=context)


def _collated(pairs: list[tuple[list[int], str, list[int], str]], **cfg) -> dict:
    samples = [
        {"__key__": str(i), "input_ids": a, "lang": la, "text2_input_ids": b, "text2_lang": lb}
        for i, (a, la, b, lb) in enumerate(pairs)
    ]
    return {"__key__": [s["__key__"] for s in samples], **_text(**cfg).collate(samples)}


def _pack(**cfg) -> PackPairs:
    (pack,) = _text(**cfg).transforms()
    return pack


# [CLS]=2 [SEP]=3 as in the tokenizer; words are ids >= 10.
PAIRS = [
    ([2, 10, 11, 3], "en", [2, 20, 21, 22, 3], "de"),
    ([2, 12, 3], "fr", [2, 23, 3], "en"),
]


def test_tlm_pair_is_one_sequence_with_restarted_positions_and_per_token_languages():
    batch = _pack(restart_positions=True)(_collated(PAIRS), torch.Generator())
    assert not [k for k in batch if k.startswith("text2_")]
    # Expected, written out: [CLS] a [SEP] b [SEP] (b's own [CLS] dropped), then padding.
    assert batch["input_ids"].tolist() == [
        [2, 10, 11, 3, 20, 21, 22, 3],
        [2, 12, 3, 23, 3, 0, 0, 0],
    ]
    assert batch["attention_mask"].tolist() == [[True] * 8, [True] * 5 + [False] * 3]
    # Positions restart at the second sentence: its tokens sit where they would alone.
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 1, 2, 3, 4]
    assert batch["position_ids"][1, :5].tolist() == [0, 1, 2, 1, 2]
    assert batch["lang_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert batch["lang_ids"][1, :5].tolist() == [2, 2, 2, 0, 0]
    assert batch["segment_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert batch["segment_ids"][1].tolist() == [0, 0, 0, 1, 1, 0, 0, 0]


def test_bert_pair_positions_continue():
    batch = _pack(restart_positions=False)(_collated(PAIRS), torch.Generator())
    assert batch["position_ids"][0].tolist() == list(range(8))
    assert batch["position_ids"][1, :5].tolist() == list(range(5))


def test_a_model_reading_both_sentences_gets_them_apart(tiny_tokenizer):
    text = _text(tiny_tokenizer, views=("text", "text2"))
    assert text.transforms() == []  # nothing to join
    out = text.decode({}, {"languages": ["en", "de"], "texts": ["a cat", "eine Katze"]}, None)
    assert tiny_tokenizer.decode(out["input_ids"]) == "a cat"
    assert tiny_tokenizer.decode(out["text2_input_ids"]) == "eine Katze"
    assert "text2_input_ids" in text.view_keys("text2") and "input_ids" in text.view_keys("text")
    with pytest.raises(ValueError, match="second text view"):
        text.decode({}, {"captions": {"en": "one"}}, None)


def test_tlm_masks_tokens_in_both_halves():
    g = torch.Generator().manual_seed(0)
    a = [2, *torch.randint(10, 100, (20,), generator=g).tolist(), 3]
    b = [2, *torch.randint(100, 200, (25,), generator=g).tolist(), 3]
    batch = _pack()(_collated([(a, "en", b, "de")] * 400), torch.Generator())
    vocab = VocabInfo(vocab_size=200, mask_id=4, special_ids=frozenset({0, 1, 2, 3, 4}))
    masked = MaskedLM.data_transform(MaskedLM.Config(), vocab)(batch, torch.Generator())
    labels = masked["mlm_labels"]
    first, second = labels[:, 1:21], labels[:, 22:47]  # the two sentences' word positions
    assert (first != IGNORE).float().mean().item() == pytest.approx(0.15, abs=0.01)
    assert (second != IGNORE).float().mean().item() == pytest.approx(0.15, abs=0.01)
    specials = torch.isin(batch["input_ids"], torch.tensor([0, 2, 3]))
    assert (labels[specials] == IGNORE).all()  # [CLS], both [SEP]s and padding never masked


def test_stacked_pairs_are_rows_of_one_view_and_other_sources_still_join():
    pack = _pack(pairs={"xlco": "stack", "tlm": "join"})
    batch = pack({**_collated(PAIRS), "__source__": "xlco"}, torch.Generator())
    assert "text2_input_ids" not in batch and batch["__pairs__"] == "stacked"
    # Rows 0..B-1: first sentences, rows B..2B-1: their translations, each alone, padded.
    assert batch["input_ids"].tolist() == [
        [2, 10, 11, 3, 0], [2, 12, 3, 0, 0], [2, 20, 21, 22, 3], [2, 23, 3, 0, 0],
    ]  # fmt: skip
    assert batch["attention_mask"].sum(1).tolist() == [4, 3, 5, 3]
    assert batch["lang_ids"][:, 0].tolist() == [0, 2, 1, 0]
    assert batch["segment_ids"].eq(0).all() and batch["__key__"] == ["0", "1", "0", "1"]
    joined = pack({**_collated(PAIRS), "__source__": "tlm"}, torch.Generator())
    assert joined["input_ids"].shape == (2, 8) and "__pairs__" not in joined


def test_pairs_setting_is_checked(tiny_tokenizer):
    with pytest.raises(ConfigError, match=r"sources.x.pairs: expected one of 'join', 'stack'"):
        from_dict(DataConfig, {"sources": {"x": {"shards": "x-*.tar", "pairs": "split"}}})
    both = DataConfig(sources={"x": SourceConfig(shards="x-*.tar", pairs="stack")})
    with pytest.raises(ValueError, match=r"\['x'\] stack pairs.*'text2'"):
        _text(tiny_tokenizer, views=("text", "text2"), pairs={"x": "stack"})
    assert both.sources["x"].pairs == "stack"


def test_segments_by_sample_format():
    rng = random.Random(0)
    nli = {"premise": "P", "hypothesis": "H", "label": "neutral", "language": "de"}
    assert segments({}, nli, ["en"], rng) == [
        Segment("P", "de", ("premise",)),
        Segment("H", "de", ("hypothesis",)),
    ]
    pair = {"languages": ["en", "ru"], "texts": ["dog", "собака"]}
    orders = {
        tuple((s.text, s.lang) for s in segments({}, pair, ["en"], random.Random(i)))
        for i in range(20)
    }
    assert orders == {(("dog", "en"), ("собака", "ru")), (("собака", "ru"), ("dog", "en"))}
    # Evaluation (no generator): the stored order, the first available caption language.
    assert [s.text for s in segments({}, pair, ["en"], None)] == ["dog", "собака"]
    caps = {"captions": {"en": "a cat", "de": "eine Katze"}}
    assert segments({}, caps, ["fr", "de", "en"], None)[0].text == "eine Katze"
    picked = {segments({}, caps, ["en", "de"], random.Random(i))[0].lang for i in range(20)}
    assert picked == {"en", "de"}
    mono = {"language": "fr"}
    assert segments({"txt": b"un chat"}, mono, ["en"], rng) == [Segment("un chat", "fr")]
    with pytest.raises(ValueError, match="no text"):
        segments({}, {}, ["en"], rng)
    with pytest.raises(ValueError, match="2 texts"):
        segments({}, {"texts": ["a"], "languages": ["en"]}, ["en"], rng)


def test_nli_labels_are_decoded_and_pairs_joined(tmp_path, tiny_tokenizer):
    with ShardWriter(str(tmp_path / "nli-%06d.tar"), 100) as w:
        for i, label in enumerate(["entailment", "neutral", "contradiction", "maybe"]):
            meta = {"premise": "a red circle", "hypothesis": "the circle is red",
                    "label": label, "language": "en"}  # fmt: skip
            w.write({"__key__": f"p{i}", "json": json.dumps(meta)})
    cfg = DataConfig(test=str(tmp_path / "nli-*.tar"), batch_size=8)
    needs = {"text": Need("text"), "label": Need("label")}
    sc = stream_config(cfg, tiny_tokenizer, split="test", needs=needs)
    batches = [b for b in ShardStream(sc, epoch=0) if "labels" in b]
    assert batches[0]["labels"].tolist() == [0, 1, 2]  # "maybe" was skipped and counted
    assert batches[0]["segment_ids"].max() == 1  # premise and hypothesis joined


# -- character spans → tokens ----------------------------------------------------------------


def test_offsets_cover_each_piece_and_round_trip(tiny_tokenizer):
    for text in ["A large blue triangle is below.", "Большой синий треугольник", "  two  spaces"]:
        ids, spans = tiny_tokenizer.encode_with_offsets(text)
        assert ids == tiny_tokenizer.encode(text)
        # Pieces cover the text left to right; what they cover, without spaces, is the text.
        assert all(a <= b for a, b in spans) and spans == sorted(spans)
        assert "".join(text[a:b] for a, b in spans) == text.replace(" ", "")


def _spans_text(tok, **cfg) -> TextData:
    return _text(tok, spans={"entity": "entities"}, **cfg)


def _first_piece(tok, text: str, start: int) -> int:
    """Index (with [CLS] at 0) of the piece that covers character ``start`` (independently)."""
    pos = 0
    for t, piece_id in enumerate(tok.encode(text)):
        piece = tok.id_to_piece(piece_id).replace("\u2581", " ")
        stripped = piece.lstrip(" ")
        pos += len(piece) - len(stripped) if text[pos : pos + 1] == " " else 0
        if pos <= start < pos + len(stripped):
            return t + 1
        pos += len(stripped)
    raise AssertionError("no piece covers the character")


def test_entity_spans_land_on_the_first_piece_and_mask_the_span(tiny_tokenizer):
    text = "A large blue triangle is below a small red circle."
    blue, circle = text.index("blue triangle"), text.index("circle")
    meta = {
        "captions": {"en": text},
        "entities": {"en": [[blue, blue + 13, 7], [circle, circle + 6, 9]]},
    }
    out = _spans_text(tiny_tokenizer).decode({}, meta, None)
    ids, mask = out["entity_ids"], out["entity_mask"]
    assert len(ids) == len(out["input_ids"]) == len(mask)
    first_blue, first_circle = (
        _first_piece(tiny_tokenizer, text, blue),
        _first_piece(tiny_tokenizer, text, circle),
    )
    assert [i for i, v in enumerate(ids) if v >= 0] == [first_blue, first_circle]
    assert ids[first_blue] == 7 and ids[first_circle] == 9
    # The mask covers exactly the pieces of "blue triangle" and "circle".
    tri_end = _first_piece(tiny_tokenizer, text, blue + 12)
    circle_end = _first_piece(tiny_tokenizer, text, circle + 5)
    expected = set(range(first_blue, tri_end + 1)) | set(range(first_circle, circle_end + 1))
    assert {i for i, m in enumerate(mask) if m} == expected
    assert not mask[0] and not mask[-1]  # [CLS] and [SEP] are no entity


def test_spans_mirror_the_text_they_annotate(tiny_tokenizer):
    text = _spans_text(tiny_tokenizer, views=("text", "text2"))
    meta = {
        "languages": ["en", "de"],
        "texts": ["the red circle", "der rote Kreis"],
        "entities": [[[4, 14, 1]], [[4, 14, 2]]],
    }
    out = text.decode({}, meta, None)
    assert max(out["entity_ids"]) == 1 and max(out["text2_entity_ids"]) == 2
    nli = {"premise": "a red circle", "hypothesis": "the circle", "language": "en",
           "entities": {"hypothesis": [[4, 10, 5]]}}  # fmt: skip
    out = text.decode({}, nli, None)
    assert max(out["entity_ids"]) == -1 and max(out["text2_entity_ids"]) == 5
    # A caption language without annotations has none; a txt member takes a plain list.
    one = _spans_text(tiny_tokenizer)
    out = one.decode({}, {"captions": {"en": "a circle"}, "entities": {"de": []}}, None)
    assert not any(out["entity_mask"])


@pytest.mark.parametrize(
    ("entities", "match"),
    [
        ([[0, 99, 1]], "outside the text"),
        ([[3, 2, 1]], "outside the text"),
        ([[0, 2, -4]], "negative id"),
        ([[0, 2]], r"not \[start, end, id\]"),
        ([[0, 2, "Q42"]], r"not \[start, end, id\]"),
        ({"en": []}, "must be a list"),
    ],
)
def test_bad_spans_are_bad_samples(tiny_tokenizer, entities, match):
    sample = {"txt": b"a red circle"}
    with pytest.raises(ValueError, match=match):
        _spans_text(tiny_tokenizer).decode(sample, {"language": "en", "entities": entities}, None)


def test_pair_packing_keeps_every_per_token_key(tiny_tokenizer):
    text = _spans_text(tiny_tokenizer)
    meta = {"languages": ["en", "de"], "texts": ["the red circle", "der rote Kreis"],
            "entities": [[[4, 14, 1]], [[4, 14, 2]]]}  # fmt: skip
    a = text.decode({}, meta, None)
    batch = text.collate([a])
    (pack,) = text.transforms()
    joined = pack(dict(batch), torch.Generator())
    assert not [k for k in joined if k.startswith("text2_")]
    n_a = len(a["input_ids"])
    # The second sentence's keys follow the first's, its [CLS] dropped.
    assert joined["entity_ids"][0].tolist() == a["entity_ids"] + a["text2_entity_ids"][1:]
    assert joined["entity_mask"][0].tolist() == a["entity_mask"] + a["text2_entity_mask"][1:]
    assert joined["segment_ids"][0, n_a:].eq(1).all()
    stacked = _spans_text(tiny_tokenizer, pairs={"s": "stack"}).transforms()[0](
        {**text.collate([a]), "__key__": ["k"], "__source__": "s"}, torch.Generator()
    )
    assert stacked["entity_ids"].shape[0] == 2 and stacked["entity_ids"][1].max() == 2


def test_spans_truncated_away_mark_nothing(tiny_tokenizer):
    text = "a red circle and a blue square"
    out = _spans_text(tiny_tokenizer, max_len=4).decode(
        {"txt": text.encode()}, {"entities": [[len(text) - 6, len(text), 3]]}, None
    )
    assert len(out["input_ids"]) == 4 and max(out["entity_ids"]) == -1


def test_sample_texts_reads_every_sentence_with_its_language():
    sample = {
        "__key__": "k",
        "jpg": b"\xff\xd8",
        "txt": b"first line\nsecond line\n",
        "json": json.dumps(
            {
                "language": "fr",
                "captions": {"en": "a cat", "de": "eine Katze"},
                "texts": ["x", "y"],
                "languages": ["en", "ru"],
            }
        ).encode(),
    }
    assert list(sample_texts(sample)) == [
        ("first line", "fr"), ("second line", "fr"), ("a cat", "en"), ("eine Katze", "de"),
        ("x", "en"), ("y", "ru"),
    ]  # fmt: skip
    with pytest.raises(ValueError):
        list(sample_texts({"json": b"{broken"}))


def test_a_language_with_several_captions_gives_one_per_draw_and_the_first_when_evaluating():
    meta = {"captions": {"en": ["a", "b", "c"], "de": "x"}}
    assert segments({}, meta, ["en"], None) == [Segment("a", "en", ("captions", "en", 0))]
    drawn = {segments({}, meta, ["en"], random.Random(i))[0].text for i in range(30)}
    assert drawn == {"a", "b", "c"}
    with pytest.raises(ValueError, match=r"captions\['en'\] holds a int"):
        segments({}, {"captions": {"en": [3]}}, ["en"], None)


def test_captions_field_reads_another_field_and_never_falls_back_to_txt():
    meta = {"captions": {"en": "it grows"}, "reversed_captions": {"en": ["it shrinks"]}}
    got = segments({"txt": b"it grows"}, meta, ["en"], None, "reversed_captions")
    assert [s.text for s in got] == ["it shrinks"]
    with pytest.raises(ValueError, match="no 'reversed_captions'"):
        segments({"txt": b"it grows"}, {"captions": meta["captions"]}, ["en"], None,
                 "reversed_captions")  # fmt: skip


def test_spans_of_one_of_several_captions(tiny_tokenizer):
    meta = {
        "captions": {"en": ["a red circle", "the blue square"]},
        "entities": {"en": [[[2, 12, 1]], [[4, 15, 2]]]},
    }
    out = _spans_text(tiny_tokenizer).decode({}, meta, None)  # evaluation: the first caption
    assert {v for v in out["entity_ids"] if v >= 0} == {1}


class _WordTok(_Tok):
    """A tokenizer of whole words (id = 10 + position in WORDS), with [CLS]=2 and [SEP]=3."""

    WORDS = ("a", "scene.", "red", "circle", "is", "left", "of", "square.")

    def encode(self, text):
        return [10 + self.WORDS.index(w) for w in text.split()]

    def build_inputs(self, ids, _, max_len):
        return [2, *ids[: max_len - 2], 3], None


def test_caption_mixture_draws_a_field_by_weight_among_those_with_a_caption():
    mixture = {"captions": 2, "pair_captions": 1, "object_captions": 1}
    text = _text(_WordTok(), caption_languages=["en", "de"], caption_mixture=mixture)
    meta = {
        "captions": {"en": "a scene.", "de": "eine Szene."},
        "object_captions": {"en": ["a red circle"], "de": ["ein roter Kreis"]},
        "pair_captions": {"en": [], "de": []},  # a lone object: no pair on offer
    }
    assert text.caption_field(meta, None) == "captions"  # evaluation reads captions_field
    n = 3000
    drawn = Counter(text.caption_field(meta, random.Random(i)) for i in range(n))
    assert set(drawn) == {"captions", "object_captions"}
    assert drawn["captions"] / n == pytest.approx(2 / 3, abs=0.03)
    meta["pair_captions"]["en"] = ["a red circle is left of a square."]
    drawn = Counter(text.caption_field(meta, random.Random(i)) for i in range(n))
    assert drawn["pair_captions"] / n == pytest.approx(1 / 4, abs=0.03)
    # the drawn field's caption is the sample's text
    objects = {"captions": {"en": "a scene."}, "object_captions": {"en": ["a red circle"]}}
    seen = set()
    for i in range(20):
        ids = text.decode({}, objects, random.Random(i))["input_ids"]
        seen.add(tuple(ids))
    assert seen == {(2, 10, 11, 3), (2, 10, 12, 13, 3)}
    assert text.decode({}, objects, None)["input_ids"] == [2, 10, 11, 3]


def test_caption_mixture_with_one_field_on_offer_draws_nothing():
    text = _text(caption_mixture={"captions": 1, "object_captions": 1})
    rng = random.Random(0)
    state = rng.getstate()
    for meta in (
        {"captions": {"en": "x"}},  # data without the finer captions: as without a mixture
        {"captions": {"en": "x"}, "object_captions": {"fr": ["un"]}},  # not in en
        {"texts": ["a", "b"], "languages": ["en", "de"]},  # not a caption sample
    ):
        assert text.caption_field(meta, rng) == "captions" and rng.getstate() == state
    only = _text(caption_mixture={"object_captions": 1})
    meta = {"captions": {"en": "x"}, "object_captions": {"en": ["y"]}}
    assert only.caption_field(meta, rng) == "object_captions" and rng.getstate() == state
    # a sample with none of the mixture's fields keeps captions_field (and its txt fallback)
    assert only.caption_field({"captions": {"en": "x"}}, rng) == "captions"


def test_caption_mixture_is_checked():
    with pytest.raises(ValueError, match=r"caption_mixture.captions must be a positive"):
        _text(caption_mixture={"captions": 0.0})
    with pytest.raises(ValueError, match=r"caption_mixture.object_captions must be a posit"):
        _text(caption_mixture={"captions": 1.0, "object_captions": float("nan")})
    with pytest.raises(ValueError, match="spans"):
        _text(caption_mixture={"captions": 1.0}, spans={"entity": "entities"})
    cfg = from_dict(TextData.Config, {"caption_mixture": {"captions": 2, "object_captions": 1}})
    assert cfg.caption_mixture == {"captions": 2.0, "object_captions": 1.0}
    with pytest.raises(ConfigError, match="caption_mixture"):
        from_dict(TextData.Config, {"caption_mixture": ["captions"]})
