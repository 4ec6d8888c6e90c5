"""Search indexes against brute force through eval's path, and their errors.

A tiny CLIP (a few steps on the tiny toyworld) indexes the 32 validation scenes; what the
index returns is checked against a torch matmul over embeddings that evaluation computes
(the retrieval pipeline's decoding and `Contrastive.embed`), never against itself.
"""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch
from conftest import cli_error, tiny_overrides
from PIL import Image

from mmptm.cli import main
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.eval.retrieval import embed_rows, retrieval_heads, retrieval_sides
from mmptm.models.load import load_pretrained
from mmptm.recipe import load_run_config
from mmptm.search.index import SearchIndex, build_index
from mmptm.search.store import IndexOptions
from mmptm.train.trainer import pretrain


def _train(world, out, recipe, steps=4, extra=()):
    cfg = load_run_config(
        recipe,
        [*tiny_overrides(world, out, recipe), f"train.max_steps={steps}", *extra],
    )
    pretrain(cfg)
    return str(out)


@pytest.fixture(scope="module")
def clip_run(tiny_world, tmp_path_factory):
    return _train(tiny_world, tmp_path_factory.mktemp("clip"), "clip_tiny")


@pytest.fixture(scope="module")
def val_shards(tiny_world):
    return str(tiny_world / "image_text" / "val-*.tar")


@pytest.fixture(scope="module")
def clip_index(clip_run, val_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("index") / "flat"
    build_index(clip_run, val_shards, out, batch_size=5)
    return SearchIndex.open(out)


def _eval_embeddings(run, shards, lang):
    """Keys, item and caption embeddings of the shards as `mmptm eval retrieval` makes them
    (captions in ``lang``)."""
    over = [f"data.modalities.text.caption_languages=[{lang}]"]
    model, tokenizer, cfg = load_pretrained(run, over)
    stream = stream_config(cfg.data, tokenizer, split="val", needs=model.data_needs(),
                           shards=shards)  # fmt: skip
    stream.batch_size = 1000
    data = next(iter(single_pass(stream)))
    sides = retrieval_sides(model, stream)
    head, _ = retrieval_heads(model)
    dev = torch.device("cpu")
    img = embed_rows(model, head, data, sides.item_keys, sides.items, dev, 7)
    txt = embed_rows(model, head, data, sides.query_keys, sides.queries, dev, 7)
    return list(data["__key__"]), img, txt


def _captions(shards, lang):
    return {
        s["__key__"]: json.loads(s["json"])["captions"][lang]
        for s in tar_samples(expand_shards(shards), SkipCounter())
    }


@pytest.mark.parametrize("lang", ["en", "ru"])
def test_text_to_image_matches_brute_force(clip_run, clip_index, val_shards, lang):
    keys, img_NE, txt_NE = _eval_embeddings(clip_run, val_shards, lang)
    captions = _captions(val_shards, lang)
    sim_NN = txt_NE @ img_NE.T  # caption i (rows) against every image
    assert len(keys) == 32 == clip_index.info["items"]
    for i in range(0, 32, 5):
        hits = clip_index.search_text(captions[keys[i]], k=5, lang=lang)
        best = torch.topk(sim_NN[i], 5)
        assert [h.key for h in hits] == [keys[j] for j in best.indices]
        np.testing.assert_allclose([h.score for h in hits], best.values.numpy(), atol=1e-5)
        assert all(h.side == "image" and h.language == lang for h in hits)
        assert hits[0].caption == captions[hits[0].key]  # shown in the asked language


def test_image_to_text_and_more_like_this_match_brute_force(clip_run, clip_index, val_shards):
    keys, img_NE, txt_NE = _eval_embeddings(clip_run, val_shards, "en")
    samples = {s["__key__"]: s for s in tar_samples(expand_shards(val_shards), SkipCounter())}
    captions = _captions(val_shards, "en")
    for i in (0, 13, 31):
        hits = clip_index.search_image(samples[keys[i]]["jpg"], k=4, lang="en")
        best = torch.topk(img_NE[i] @ txt_NE.T, 4)
        assert [h.key for h in hits] == [keys[j] for j in best.indices]
        np.testing.assert_allclose([h.score for h in hits], best.values.numpy(), atol=1e-5)
        assert all(h.side == "text" and h.caption == captions[h.key] for h in hits)
        # more like this: the image's neighbours among the other images
        sim_N = img_NE @ img_NE[i]
        sim_N[i] = -2.0  # itself left out
        best = torch.topk(sim_N, 3)
        hits = clip_index.search_key(keys[i], k=3)
        assert [h.key for h in hits] == [keys[j] for j in best.indices]
        np.testing.assert_allclose([h.score for h in hits], best.values.numpy(), atol=1e-5)


def test_text_sides_hold_every_language_and_items_their_fields(clip_index, val_shards):
    info = clip_index.info
    assert info["languages"] == ["de", "en", "es", "fr", "ru"]
    assert info["sides"]["text"]["n"] == 5 * 32 and info["sides"]["image"]["n"] == 32
    key = "val000004"
    meta = json.loads(
        next(
            s for s in tar_samples(expand_shards(val_shards), SkipCounter()) if s["__key__"] == key
        )["json"]
    )
    item = clip_index.item(key)
    assert item["texts"] == {lang: [c] for lang, c in meta["captions"].items()}
    assert item["json"]["objects"] == meta["objects"] and "captions" not in item["json"]
    assert item["vectors"] == {"image": 1, "text": 5}
    # a text query searched within one language of the text side
    hits = clip_index.search_text(meta["captions"]["de"], k=3, side="text", lang="de")
    assert all(h.language == "de" and h.side == "text" for h in hits)


def test_thumbnails_are_small_jpegs_of_the_image(clip_index, val_shards):
    sample = next(s for s in tar_samples(expand_shards(val_shards), SkipCounter()))
    jpeg = clip_index.thumbnail(sample["__key__"])
    thumb = Image.open(io.BytesIO(jpeg))
    original = Image.open(io.BytesIO(sample["jpg"])).convert("RGB")
    assert thumb.format == "JPEG" and thumb.size == original.size  # 32 px: not enlarged
    diff = np.abs(np.asarray(thumb, np.float32) - np.asarray(original, np.float32)).mean()
    assert diff < 12.0  # the same picture, up to JPEG loss


@pytest.mark.parametrize(
    ("options", "query_setting"),
    [(IndexOptions(type="ivf", nlist=4, nprobe=4), {}), (IndexOptions(type="hnsw", ef=64), {})],
)
def test_approximate_indexes_are_exact_when_searching_everything(
    clip_run, clip_index, val_shards, tmp_path, options, query_setting
):
    build_index(clip_run, val_shards, tmp_path / "approx", options=options, batch_size=16)
    approx = SearchIndex.open(tmp_path / "approx")
    assert approx.info["options"]["type"] == options.type
    if options.type == "ivf":
        assert {p["nlist"] for p in approx.info["parts"]} == {4}
    for query in ("a red circle", "Ein blaues Quadrat", "un triangle vert"):
        for side in ("image", "text"):
            want = clip_index.search_text(query, k=10, side=side)
            got = approx.search_text(query, k=10, side=side)
            assert [h.key for h in got] == [h.key for h in want]
            np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5)
    if options.type == "ivf":  # fewer cells visited: still valid hits, perhaps other ones
        approx.set_search(nprobe=1)
        assert len(approx.search_text("a red circle", k=3)) == 3
        with pytest.raises(ValueError, match="--ef applies to hnsw"):
            approx.set_search(ef=8)


def test_add_then_search_equals_build_all_at_once(clip_run, clip_index, val_shards, tmp_path):
    first, second = expand_shards(val_shards)
    out = tmp_path / "added"
    build_index(clip_run, first, out, batch_size=16)
    summary = build_index(clip_run, f"{first},{second}", out, add=True, batch_size=16)
    # the first shard's 16 keys are already there: skipped and counted, not indexed twice
    assert summary["added"] == 16 and summary["skipped"]["duplicate"] == 16
    assert summary["items"] == 32
    added = SearchIndex.open(out)
    assert added.info["counts"] == clip_index.info["counts"]
    for query in ("a small red star", "Маленький синий круг"):
        for side in ("image", "text"):
            want = clip_index.search_text(query, k=8, side=side)
            got = added.search_text(query, k=8, side=side)
            assert [(h.key, h.caption) for h in got] == [(h.key, h.caption) for h in want]
            np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-6)
    assert added.thumbnail("val000020") == clip_index.thumbnail("val000020")
    # the files of the replaced generation are gone
    assert sorted(p.name for p in out.glob("*.faiss")) == sorted(
        p["index"] for p in added.info["parts"]
    )
    nothing = build_index(clip_run, second, out, add=True)
    assert nothing["added"] == 0 and nothing["skipped"]["duplicate"] == 16


def test_errors(clip_run, clip_index, val_shards, tiny_world, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SearchIndex.open(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not an mmptm index"):
        SearchIndex.open(tmp_path / "plain")
    (tmp_path / "plain" / "index.json").write_text('{"format": "faiss"}')
    with pytest.raises(ValueError, match="not an mmptm index description"):
        SearchIndex.open(tmp_path / "plain")
    with pytest.raises(ValueError, match="already holds an index"):
        build_index(clip_run, val_shards, clip_index.path)
    with pytest.raises(ValueError, match="contrastive \\(contrastive\\)"):
        clip_index.search_text("a red circle", rerank_k=5)
    with pytest.raises(ValueError, match="not a decodable image"):
        clip_index.search_image(b"GIF89a not really")
    with pytest.raises(KeyError, match="no item 'nope'"):
        clip_index.search_key("nope")
    with pytest.raises(KeyError, match="no item"):
        clip_index.thumbnail("nope")
    for bad in ("", "   "):
        with pytest.raises(ValueError, match="empty"):
            clip_index.search_text(bad)
    with pytest.raises(ValueError, match="at most 1000"):
        clip_index.search_text("x" * 1001)
    with pytest.raises(ValueError, match="unknown side 'audio'"):
        clip_index.search_text("a red circle", side="audio")
    with pytest.raises(ValueError, match="unknown language 'it'"):
        clip_index.search_text("a red circle", lang="it")
    with pytest.raises(ValueError, match="k must be"):
        clip_index.search_text("a red circle", k=0)
    with pytest.raises(ValueError, match="--nprobe applies to ivf"):
        clip_index.set_search(nprobe=4)
    # another run (other weights) may not add to the index, nor open it
    other = _train(tiny_world, tmp_path / "other", "clip_tiny", steps=2)
    copy = tmp_path / "copy"
    shutil.copytree(clip_index.path, copy)
    with pytest.raises(ValueError, match="other weights"):
        build_index(other, val_shards, copy, add=True)
    with pytest.raises(ValueError, match="other weights"):
        SearchIndex.open(copy, run=other)
    with pytest.raises(ValueError, match="keeps the index's settings"):
        build_index(clip_run, val_shards, copy, add=True, options=IndexOptions(type="ivf"))


def test_cli_index_and_retrieve(clip_run, val_shards, tmp_path, capsys):
    out = str(tmp_path / "cli")
    assert main(["index", clip_run, "--shards", val_shards, "--out", out, "--index-type",
                 "hnsw", "--ef", "40", "--batch-size", "8", "--workers", "2"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["added"] == 32 and summary["parts"]["text/en"] == 32
    caption = _captions(val_shards, "en")["val000007"]
    assert main(["retrieve", out, caption, "-k", "3", "--json", "--lang", "en"]) == 0
    result = json.loads(capsys.readouterr().out)
    hits = result["hits"]
    assert [h["rank"] for h in hits] == [1, 2, 3] and result["ms"] > 0
    assert hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"]
    assert all(h["side"] == "image" and h["language"] == "en" for h in hits)
    assert main(["retrieve", out, "--key", "val000007", "-k", "2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["rank", "score", "key", "lang", "caption"]
    assert len(table) == 4 and "val000007" not in "".join(table[1:3])
    assert "contrastive" in cli_error(capsys, ["retrieve", out, "x", "--rerank-k", "4"])
    assert "one of QUERY" in cli_error(capsys, ["retrieve", out, "x", "--key", "val000007"])
    assert "no item" in cli_error(capsys, ["retrieve", out, "--key", "nope"])
    assert "--nprobe applies to ivf" in cli_error(capsys, ["retrieve", out, "x", "--nprobe", "2"])
    assert "does not exist" in cli_error(capsys, ["retrieve", str(tmp_path / "none"), "x"])
    image = tmp_path / "not_an_image.jpg"
    image.write_bytes(b"\x00" * 100)
    assert "not a decodable image" in cli_error(capsys, ["retrieve", out, "--image", str(image)])
    assert "--add keeps" in cli_error(
        capsys, ["index", clip_run, "--shards", val_shards, "--out", out, "--add", "--m", "8"]
    )


def test_images_without_captions_and_bad_samples(
    clip_run, val_shards, tmp_path, monkeypatch, caplog
):
    from mmptm.data.shards import ShardWriter
    from mmptm.search import index as search_index

    monkeypatch.setattr(search_index, "LOG_EVERY", 1)  # no terminal here: a line per batch

    samples = list(tar_samples(expand_shards(val_shards), SkipCounter()))[:10]
    with ShardWriter(tmp_path / "photos-%03d.tar", 100) as w:
        for s in samples:
            w.write({"__key__": s["__key__"], "jpg": s["jpg"]})  # no caption, no json
        w.write({"__key__": "broken", "jpg": b"\xff\xd8 truncated"})
    with caplog.at_level("INFO", logger="mmptm.search.index"):
        summary = build_index(clip_run, str(tmp_path / "photos-*.tar"), tmp_path / "index",
                              batch_size=4)  # fmt: skip
    assert summary["added"] == 10 and summary["skipped"]["bad"] == 1
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("index: ")]
    assert len(progress) == 3 and progress[-1].startswith("index: 10 / 11 samples")
    index = SearchIndex.open(tmp_path / "index")
    assert index.info["languages"] == [] and "text" not in index.info["counts"]
    hits = index.search_text("a red circle", k=3)
    assert len(hits) == 3 and all(h.caption == "" and h.language is None for h in hits)
    assert index.search_image(samples[2]["jpg"], k=1, side="image")[0].key == samples[2]["__key__"]


def test_image_queries_of_any_format_are_read_in_their_own_mode(clip_index, val_shards):
    """A TIFF or GIF query gives what the same picture gives as a PNG of its own mode: the
    plug-in resizes it in that mode, as open_clip does (not turned into RGB first)."""
    import io

    from PIL import Image

    sample = next(iter(tar_samples(expand_shards(val_shards), SkipCounter())))
    # larger than the model's input, so that the plug-in resizes it (in which mode matters)
    rgba = Image.open(io.BytesIO(sample["jpg"])).convert("RGBA").resize((83, 71))
    rgba.putalpha(Image.linear_gradient("L").resize(rgba.size))

    def encoded(picture: Image.Image, fmt: str) -> bytes:
        buf = io.BytesIO()
        picture.save(buf, fmt)
        return buf.getvalue()

    def scores(query) -> list[float]:
        return [h.score for h in clip_index.search_image(query, k=4, lang="en")]

    png = scores(encoded(rgba, "PNG"))
    np.testing.assert_allclose(scores(encoded(rgba, "TIFF")), png, atol=1e-6)
    np.testing.assert_allclose(scores(rgba), png, atol=1e-6)
    gif = encoded(rgba.convert("RGB"), "GIF")
    palette = Image.open(io.BytesIO(gif))
    assert palette.mode == "P"
    np.testing.assert_allclose(scores(gif), scores(encoded(palette, "PNG")), atol=1e-6)
