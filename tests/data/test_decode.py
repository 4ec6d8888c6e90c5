"""Text views per sample format, TLM pair joining, and source mixtures with alpha sampling."""

from __future__ import annotations

import collections
import json
import random
from dataclasses import replace

import pytest
import torch

from mmptm.data.decode import Collate, ConcatPair, text_views
from mmptm.data.pipeline import (
    DataConfig,
    ShardStream,
    SourceConfig,
    mixture,
    stream_config,
)
from mmptm.data.shards import ShardWriter
from mmptm.encoders.base import VocabInfo
from mmptm.objectives.mlm import IGNORE, MaskedLM

LANG = {"en": 0, "de": 1, "fr": 2}


def _collated(pairs: list[tuple[list[int], str, list[int], str]]) -> dict:
    samples = [
        {"__key__": str(i), "input_ids": a, "lang": la, "text2_input_ids": b, "text2_lang": lb}
        for i, (a, la, b, lb) in enumerate(pairs)
    ]
    return Collate(pad_id=0, lang_index=LANG.__getitem__)(samples)


# [CLS]=2 [SEP]=3 as in the tokenizer; words are ids >= 10.
PAIRS = [
    ([2, 10, 11, 3], "en", [2, 20, 21, 22, 3], "de"),
    ([2, 12, 3], "fr", [2, 23, 3], "en"),
]


def test_tlm_pair_is_one_sequence_with_restarted_positions_and_per_token_languages():
    batch = ConcatPair(pad_id=0, restart_positions=True)(_collated(PAIRS), torch.Generator())
    assert "text2_input_ids" not in batch
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


def test_bert_pair_positions_continue():
    batch = ConcatPair(pad_id=0, restart_positions=False)(_collated(PAIRS), torch.Generator())
    assert batch["position_ids"][0].tolist() == list(range(8))
    assert batch["position_ids"][1, :5].tolist() == list(range(5))


def test_tlm_masks_tokens_in_both_halves():
    g = torch.Generator().manual_seed(0)
    a = [2, *torch.randint(10, 100, (20,), generator=g).tolist(), 3]
    b = [2, *torch.randint(100, 200, (25,), generator=g).tolist(), 3]
    batch = ConcatPair(pad_id=0)(_collated([(a, "en", b, "de")] * 400), torch.Generator())
    vocab = VocabInfo(vocab_size=200, mask_id=4, special_ids=frozenset({0, 1, 2, 3, 4}))
    masked = MaskedLM.data_transform(MaskedLM.Config(), vocab)(batch, torch.Generator())
    labels = masked["mlm_labels"]
    first, second = labels[:, 1:21], labels[:, 22:47]  # the two sentences' word positions
    assert (first != IGNORE).float().mean().item() == pytest.approx(0.15, abs=0.01)
    assert (second != IGNORE).float().mean().item() == pytest.approx(0.15, abs=0.01)
    specials = torch.isin(batch["input_ids"], torch.tensor([0, 2, 3]))
    assert (labels[specials] == IGNORE).all()  # [CLS], both [SEP]s and padding never masked


def test_stacked_pairs_are_rows_of_one_view_and_other_sources_still_join():
    pair = ConcatPair(pad_id=0, stack=frozenset({"xlco"}))
    batch = pair({**_collated(PAIRS), "__source__": "xlco"}, torch.Generator())
    assert "text2_input_ids" not in batch and batch["__pairs__"] == "stacked"
    # Rows 0..B-1: first sentences, rows B..2B-1: their translations, each alone, padded.
    assert batch["input_ids"].tolist() == [
        [2, 10, 11, 3, 0], [2, 12, 3, 0, 0], [2, 20, 21, 22, 3], [2, 23, 3, 0, 0],
    ]  # fmt: skip
    assert batch["attention_mask"].sum(1).tolist() == [4, 3, 5, 3]
    assert batch["lang_ids"][:, 0].tolist() == [0, 2, 1, 0]
    assert batch["segment_ids"].eq(0).all() and batch["__key__"] == ["0", "1", "0", "1"]
    joined = pair({**_collated(PAIRS), "__source__": "tlm"}, torch.Generator())
    assert joined["input_ids"].shape == (2, 8) and "__pairs__" not in joined


def test_pairs_setting_is_checked(tiny_tokenizer):
    bad = DataConfig(sources={"x": SourceConfig(shards="x-*.tar", pairs="split")})
    with pytest.raises(ValueError, match=r"data.sources.x.pairs must be join or stack"):
        stream_config(bad, tiny_tokenizer, needs=("text",))
    both = DataConfig(sources={"x": SourceConfig(shards="x-*.tar", pairs="stack")})
    with pytest.raises(ValueError, match=r"\['x'\] stack pairs.*text2 encoder"):
        stream_config(both, tiny_tokenizer, needs=("text", "text2"))


def test_text_views_by_sample_format():
    rng = random.Random(0)
    nli = {"premise": "P", "hypothesis": "H", "label": "neutral", "language": "de"}
    assert text_views({}, nli, ["en"], rng) == [("P", "de"), ("H", "de")]
    pair = {"languages": ["en", "ru"], "texts": ["dog", "собака"]}
    orders = {tuple(text_views({}, pair, ["en"], random.Random(i))) for i in range(20)}
    assert orders == {(("dog", "en"), ("собака", "ru")), (("собака", "ru"), ("dog", "en"))}
    mono = {"language": "fr"}
    assert text_views({"txt": b"un chat"}, mono, ["en"], rng) == [("un chat", "fr")]
    caps = {"captions": {"en": "a cat", "de": "eine Katze"}}
    assert text_views({}, caps, ["de"], rng) == [("eine Katze", "de")]
    with pytest.raises(ValueError, match="no text"):
        text_views({}, {}, ["en"], rng)
    with pytest.raises(ValueError, match="2 texts"):
        text_views({}, {"texts": ["a"], "languages": ["en"]}, ["en"], rng)


def _mono_shards(root, sizes: dict[str, int]) -> str:
    for lang, n in sizes.items():
        with ShardWriter(str(root / f"train-{lang}-%06d.tar"), 1000) as w:
            for i in range(n):
                w.write({"__key__": f"{lang}{i}", "txt": f"{lang} {i}", "json": {"language": lang}})
    return str(root / "train-{lang}-*.tar")


def test_alpha_sampling_probabilities(tmp_path):
    sizes = {"en": 800, "de": 150, "fr": 50}
    spec = _mono_shards(tmp_path, sizes)
    sources = {
        "mono": SourceConfig(shards=spec, weight=3.0, languages=list(sizes), alpha=0.5),
        "other": SourceConfig(shards=str(tmp_path / "train-fr-*.tar"), weight=1.0),
    }
    probs = {s.name: s.prob for s in mixture(sources)}
    # Independent: q_l = (n_l / N)^alpha, normalised, times the source's share 3/4.
    q = {lang: (n / 1000) ** 0.5 for lang, n in sizes.items()}
    for lang in sizes:
        assert probs[f"mono/{lang}"] == pytest.approx(0.75 * q[lang] / sum(q.values()))
    assert probs["other"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match=r"\{lang\} placeholder"):
        mixture({"x": SourceConfig(shards=str(tmp_path / "train-en-*.tar"), languages=["en"])})


def test_mixture_draws_whole_batches_from_one_source_by_probability(tmp_path, tiny_tokenizer):
    spec = _mono_shards(tmp_path, {"en": 300, "de": 300})
    cfg = DataConfig(
        sources={"mono": SourceConfig(shards=spec, languages=["en", "de"], alpha=1.0)},
        batch_size=4,
    )
    sc = stream_config(cfg, tiny_tokenizer, needs=("text",))
    counts = collections.Counter()
    for _, batch in zip(range(400), ShardStream(sc, epoch=0)):
        langs = {k.rstrip("0123456789") for k in batch["__key__"]}
        assert len(langs) == 1  # one language per batch, as XLM samples them
        assert batch["__source__"] == f"mono/{langs.pop()}"
        counts[batch["__source__"]] += 1
    assert counts["mono/en"] / 400 == pytest.approx(0.5, abs=0.08)  # endless: 1600 > 600 samples
    again = [b["__key__"] for _, b in zip(range(20), ShardStream(sc, epoch=0))]
    first = [b["__key__"] for _, b in zip(range(20), ShardStream(replace(sc), epoch=0))]
    assert again == first  # seeded


def test_nli_labels_are_decoded(tmp_path, tiny_tokenizer):
    with ShardWriter(str(tmp_path / "nli-%06d.tar"), 100) as w:
        for i, label in enumerate(["entailment", "neutral", "contradiction", "maybe"]):
            meta = {"premise": "a red circle", "hypothesis": "the circle is red",
                    "label": label, "language": "en"}  # fmt: skip
            w.write({"__key__": f"p{i}", "json": json.dumps(meta)})
    cfg = DataConfig(test=str(tmp_path / "nli-*.tar"), batch_size=8)
    sc = stream_config(cfg, tiny_tokenizer, split="test", needs=("text",))
    batches = [b for b in ShardStream(sc, epoch=0) if "labels" in b]
    assert batches[0]["labels"].tolist() == [0, 1, 2]  # "maybe" was skipped and counted
    assert batches[0]["segment_ids"].max() == 1  # premise and hypothesis joined
