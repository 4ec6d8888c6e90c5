"""Indexes of the other dual encoders: ALBEF (ITC over regions, ITM re-ranking) and the
text↔text model (sentences of one language, queries in another)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from conftest import tiny_overrides
from PIL import Image

from mmptm.data.pipeline import single_pass, stream_config
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.eval.retrieval import embed_rows, itm_scores, retrieval_heads, retrieval_sides
from mmptm.eval.xlingual import text_plugin
from mmptm.models.load import load_pretrained
from mmptm.recipe import load_run_config
from mmptm.search.index import SearchIndex, build_index
from mmptm.train.trainer import pretrain


def _train(world, out, recipe, steps=4):
    cfg = load_run_config(
        recipe,
        [*tiny_overrides(world, out, recipe), f"train.max_steps={steps}"],
    )
    pretrain(cfg)
    return str(out)


def test_albef_reranks_the_first_stage_with_itm(tiny_world, tmp_path):
    run = _train(tiny_world, tmp_path / "albef", "albef_tiny")
    shards = str(tiny_world / "regions" / "val-*.tar")
    build_index(run, shards, tmp_path / "index", batch_size=8)
    index = SearchIndex.open(tmp_path / "index")
    assert index.info["sides"]["regions"]["n"] == 32 and index.info["rerank"]
    assert index.item("val000000")["has_thumbnail"]  # the shards' jpg, via the image plug-in

    # ITM scores as evaluation computes them: its pipeline decodes every sample of the split
    model, tokenizer, cfg = load_pretrained(run)
    stream = stream_config(cfg.data, tokenizer, split="val", needs=model.data_needs(),
                           shards=shards)  # fmt: skip
    stream.batch_size = 1000
    data = next(iter(single_pass(stream)))
    keys = list(data["__key__"])
    _, itm = retrieval_heads(model)
    sides = retrieval_sides(model, stream)
    query_row = 5
    caption = json.loads(
        next(s for s in tar_samples(expand_shards(shards), SkipCounter())
             if s["__key__"] == keys[query_row])["json"]
    )["captions"]["en"]  # fmt: skip

    first = index.search_text(caption, k=10)
    hits = index.search_text(caption, k=10, rerank_k=4)
    assert {h.key for h in hits[:4]} == {h.key for h in first[:4]}  # the same candidates
    assert [h.key for h in hits[4:]] == [h.key for h in first[4:]]  # the rest as they were
    assert all(h.itm is None for h in hits[4:])
    rows = torch.tensor([keys.index(h.key) for h in hits[:4]])
    want = itm_scores(itm, model, data, sides, rows, torch.full((4,), query_row),
                      torch.device("cpu"), 3)  # fmt: skip
    np.testing.assert_allclose([h.itm for h in hits[:4]], want.numpy(), atol=1e-4)
    # ordered by ITM + the contrastive logit (ALBEF's rule, as evaluation)
    contrastive, _ = retrieval_heads(model)
    combined = [h.itm + float(contrastive.scale()) * h.score for h in hits[:4]]
    assert combined == sorted(combined, reverse=True)
    with pytest.raises(ValueError, match="side 'text' is text"):
        index.search_text(caption, side="text", rerank_k=4)


def test_text_to_text_across_languages(tiny_world, tmp_path):
    run = _train(tiny_world, tmp_path / "xtext", "xtext_clip_tiny")
    english = str(tiny_world / "mono" / "val-en-*.tar")
    summary = build_index(run, english, tmp_path / "index", batch_size=8)
    index = SearchIndex.open(tmp_path / "index")
    info = index.info
    assert set(info["sides"]) == {"text", "text2"} and info["languages"] == ["en"]
    assert summary["parts"] == {"text/en": summary["items"], "text2/en": summary["items"]}

    # brute force: every English sentence and a German query, through the run's text plug-in
    model, tokenizer, cfg = load_pretrained(run)
    head, _ = retrieval_heads(model)
    plugin = text_plugin(cfg, tokenizer)
    samples = list(tar_samples(expand_shards(english), SkipCounter()))
    sentences = [s["txt"].decode() for s in samples]

    def embed(texts, lang, view):
        batch = plugin.collate([plugin.encode(t, lang) for t in texts])
        if view != "text":
            batch = {f"{view}_{k}": v for k, v in batch.items()}
        return head.embed(model.fuse(batch), view)

    with torch.no_grad():
        items_NE = embed(sentences, "en", "text2")
        query = "Ein kleiner roter Kreis."
        sim_N = items_NE @ embed([query], "de", "text")[0]
    best = torch.topk(sim_N, 5)
    hits = index.search_text(query, k=5, lang="en", query_lang="de")
    assert all(h.side == "text2" and h.language == "en" for h in hits)
    assert [h.key for h in hits] == [samples[j]["__key__"] for j in best.indices]
    assert [h.caption for h in hits] == [sentences[j] for j in best.indices]
    np.testing.assert_allclose([h.score for h in hits], best.values.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="no side of this index's model reads images"):
        index.search_image(_png())


def test_sounds_are_indexed_through_their_plug_in(tiny_world, tmp_path):
    """CLAP: the audio side's stored vectors are the ones evaluation computes."""
    run = _train(tiny_world, tmp_path / "clap", "clap_tiny", steps=2)
    shards = str(tiny_world / "audio" / "val-*.tar")
    build_index(run, shards, tmp_path / "index", batch_size=8)
    index = SearchIndex.open(tmp_path / "index")
    assert index.info["sides"]["audio"]["n"] == 32 and not index.info["sides"]["audio"]["text"]

    model, tokenizer, cfg = load_pretrained(run)
    stream = stream_config(cfg.data, tokenizer, split="val", needs=model.data_needs(),
                           shards=shards)  # fmt: skip
    stream.batch_size = 1000
    data = next(iter(single_pass(stream)))
    head, _ = retrieval_heads(model)
    sides = retrieval_sides(model, stream)
    want_NE = embed_rows(model, head, data, sides.item_keys, "audio", torch.device("cpu"), 5)
    (part,) = [p for p in index.parts if p.side == "audio"]
    for i in (0, 17, 31):
        row = int(np.flatnonzero(part.rows[:, 0] == index.number[data["__key__"][i]])[0])
        np.testing.assert_allclose(part.index.reconstruct(row), want_NE[i].numpy(), atol=1e-5)
    hits = index.search_text("a dog barks", k=3, lang="en")
    assert len(hits) == 3 and all(h.side == "audio" for h in hits)
    with pytest.raises(ValueError, match="no side of this index's model reads images"):
        index.search_image(_png())


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buf, "PNG")
    return buf.getvalue()
