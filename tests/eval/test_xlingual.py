"""Cross-lingual retrieval (``eval xret``): which sentence vector it reads, checked against
manual forwards, and the accuracy against an independent count."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import cli_error, tiny_overrides

from mmptm.eval.xlingual import (
    SentenceEncoder,
    SentenceVector,
    centered,
    evaluate_xlingual,
    evaluate_xlingual_vectors,
    read_pairs,
    retrieval_accuracy,
    text_plugin,
    xlingual_retrieval,
    xlingual_retrievals,
)
from mmptm.models.load import build_model, load_pretrained
from mmptm.recipe import load_run_config
from mmptm.train.trainer import pretrain


def _config(world, out, recipe, *extra):
    over = [*tiny_overrides(world, out, recipe), "model.fusion.transformer.layers=3", *extra]
    return load_run_config(recipe, over)


@pytest.fixture(scope="module")
def xlco_run(tiny_world, tmp_path_factory):
    run = tmp_path_factory.mktemp("xlco")
    pretrain(_config(tiny_world, run, "xlm_xlco_tiny", "train.max_steps=2"))
    return run


def _batch(cfg, tok, texts, lang, view="text"):
    plugin = text_plugin(cfg, tok, view)
    prefix = "" if view == "text" else f"{view}_"
    samples = [{prefix + k: v for k, v in plugin.encode(t, lang).items()} for t in texts]
    return plugin.collate(samples)


SENTENCES = ["a small red circle", "ein großes blaues Quadrat links", "x"]


@torch.no_grad()
def test_layer_k_is_the_kth_block_output_of_a_manual_forward(tiny_world, tmp_path):
    cfg = _config(tiny_world, tmp_path, "xlm_tlm_tiny")
    model, tok = build_model(cfg)
    model.eval()
    batch = _batch(cfg, tok, SENTENCES, "de")
    mask = batch["attention_mask"]
    x = model.encoders["text"](batch).tokens
    manual = [x]
    for block in model.fusion.stack.blocks:
        x = block(x, mask)
        manual.append(x)
    manual[-1] = model.fusion.stack.norm(x)  # the last layer is the fusion's output

    def mean(x_BLD):  # masked mean, computed apart from fusion.base.pool
        return F.normalize(
            torch.stack([x_BLD[i, : int(mask[i].sum())].mean(0) for i in range(len(x_BLD))]), dim=-1
        )

    for layer, expect in [(0, 0), (1, 1), (2, 2), (3, 3), (-1, 3), (-3, 1), (None, 3)]:
        encode = SentenceEncoder(model, cfg, tok, SentenceVector("mean", layer))
        torch.testing.assert_close(encode(SENTENCES, "de"), mean(manual[expect]))
        assert encode.layers == 3
    first = SentenceEncoder(model, cfg, tok, SentenceVector("first", 2))(SENTENCES, "de")
    torch.testing.assert_close(first, F.normalize(manual[2][:, 0], dim=-1))
    assert not torch.allclose(mean(manual[1]), mean(manual[2]))  # the layers do differ
    with pytest.raises(ValueError, match=r"--layer 4 is out of range: the model has layers 0\.\.3"):
        SentenceEncoder(model, cfg, tok, SentenceVector("mean", 4))(SENTENCES, "de")


@torch.no_grad()
def test_auto_is_the_contrastive_objectives_projected_vector(tiny_world, tmp_path):
    cfg = _config(tiny_world, tmp_path, "xlm_xlco_tiny")
    model, tok = build_model(cfg)
    model.eval()
    assert SentenceVector.resolve(model, "auto", None) == SentenceVector("xlco")
    assert SentenceVector.resolve(model, "auto", 2) == SentenceVector("mean", 2)
    proj = model.objectives["xlco"].proj["text"]
    proj.weight.copy_(torch.randn_like(proj.weight))  # far from the identity
    auto = SentenceEncoder(model, cfg, tok, SentenceVector.resolve(model, "auto", None))
    first = SentenceEncoder(model, cfg, tok, SentenceVector("first"))
    mean = SentenceEncoder(model, cfg, tok, SentenceVector("mean"))
    fused = model.fuse(_batch(cfg, tok, SENTENCES, "en"))
    hidden, m = fused.hidden["text"], fused.mask["text"].unsqueeze(-1).float()
    assert cfg.model.fusion.modality_pooling == "mean"  # the recipe aligns the token mean
    tokens_mean = (hidden * m).sum(1) / m.sum(1)
    expect = F.normalize(tokens_mean @ proj.weight.T, dim=-1)  # through the projection
    torch.testing.assert_close(auto(SENTENCES, "en"), expect)
    assert (auto(SENTENCES, "en") - first(SENTENCES, "en")).abs().max() > 0.1
    assert (auto(SENTENCES, "en") - mean(SENTENCES, "en")).abs().max() > 0.1
    assert "xlco (mean + projection)" == SentenceVector("xlco").describe(model, 0)


@torch.no_grad()
def test_two_view_contrast_encodes_the_pivot_and_the_other_language_as_its_views(
    tiny_world, tmp_path
):
    cfg = _config(tiny_world, tmp_path, "xtext_clip_tiny")
    model, tok = build_model(cfg)
    model.eval()
    obj = model.objectives["contrastive"]
    for view in ("text", "text2"):  # two different projections make the views tell apart
        obj.proj[view].weight.copy_(torch.randn_like(obj.proj[view].weight))
    encode = SentenceEncoder(model, cfg, tok, SentenceVector.resolve(model, "auto", None))
    for side, view in (("pivot", "text"), ("other", "text2")):
        out = model.fuse(_batch(cfg, tok, SENTENCES, "de", view))
        expect = F.normalize(obj.proj[view](out.pooled[view]), dim=-1)
        torch.testing.assert_close(encode(SENTENCES, "de", side), expect)
    assert not torch.allclose(encode(SENTENCES, "de", "pivot"), encode(SENTENCES, "de", "other"))


def test_bad_pooling_and_layer_are_one_line_errors(tiny_world, tmp_path, xlco_run, capsys):
    model, _, _ = load_pretrained(str(xlco_run))
    with pytest.raises(ValueError, match="auto, mean, first, or an aligned objective: xlco"):
        SentenceVector.resolve(model, "cls", None)
    with pytest.raises(ValueError, match="--layer applies to mean or first pooling"):
        SentenceVector.resolve(model, "xlco", 1)
    line = cli_error(capsys, ["eval", "xret", str(xlco_run), "--shards",
                              f"{tiny_world}/parallel/test-*.tar", "--layer", "9"])  # fmt: skip
    assert "--layer 9 is out of range" in line


def test_retrieval_accuracy_counts_both_directions():
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]])
    b = torch.tensor([[0.6, 0.8], [0.0, 1.0], [1.0, 0.0]])
    # a·b rows [.6 0 1] [.8 1 0] [.96 .6 .8]: only row 1 finds its partner; columns
    # [.6 .8 .96] [0 1 .6] [1 0 .8]: only column 1
    assert retrieval_accuracy(a, b) == pytest.approx(1 / 3)
    assert retrieval_accuracy(a, a) == 1.0


def test_eval_xret_reports_the_aligned_vector_and_the_mean(tiny_world, xlco_run, capsys):
    from mmptm.cli import main

    shards = f"{tiny_world}/parallel/test-*.tar"
    assert main(["eval", "xret", str(xlco_run), "--shards", shards]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(result) == ["xlco (mean + projection)", "mean, layer 3 of 3"]
    # each row equals an evaluation with that one vector, from the library
    assert result["xlco (mean + projection)"] == evaluate_xlingual(str(xlco_run), shards)
    mean = evaluate_xlingual(str(xlco_run), shards, pooling="mean")
    assert result["mean, layer 3 of 3"] == mean
    # and the accuracy is what a count over the pairs gives
    model, tok, cfg = load_pretrained(str(xlco_run))
    pairs = read_pairs(shards, "en", 500)
    encode = SentenceEncoder(model, cfg, tok, SentenceVector("mean"))
    for lang, pp in pairs.items():
        x, en = encode([p[1] for p in pp], lang), encode([p[0] for p in pp], "en")
        sims = (x @ en.T).tolist()
        hits = sum(max(range(len(pp)), key=row.__getitem__) == i for i, row in enumerate(sims))
        hits += sum(max(range(len(pp)), key=lambda i, j=j: sims[i][j]) == j for j in range(len(pp)))
        assert mean[lang] == pytest.approx(hits / (2 * len(pp)))
    one = evaluate_xlingual_vectors(str(xlco_run), shards, poolings=["mean"], layer=0)
    assert list(one) == ["mean, layer 0 of 3"]
    # layer 0's vectors are not the last layer's (near initialisation their accuracies on
    # these few pairs may coincide, so compare the vectors themselves)
    lang, pp = next(iter(pairs.items()))
    layer0 = SentenceEncoder(model, cfg, tok, SentenceVector("mean", 0))([p[1] for p in pp], lang)
    assert (layer0 - encode([p[1] for p in pp], lang)).abs().max() > 1e-3  # same layer: 0


def test_centering_removes_each_languages_mean_before_the_cosine():
    en = torch.tensor([[1.0, 0.0, 5.0], [0.0, 1.0, 5.0]])
    xx = torch.tensor([[2.0, 0.0, -5.0], [0.0, 0.5, -5.0]])
    vectors = {"en": F.normalize(en, dim=-1), "xx": F.normalize(xx, dim=-1)}

    def encode(texts, lang, side="pivot"):
        return vectors[lang]

    pairs = {"xx": [("a", "b"), ("c", "d")]}
    # by hand: uncentered, xx→en finds both, en→xx only the first (cosines -0.91 vs -0.96
    # send en row 1 to xx row 0): (1 + 1/2) / 2
    assert xlingual_retrieval(encode, pairs, "en")["xx"] == pytest.approx(0.75)
    # centered, en rows become ±[1, -1, 0]/√2 and xx rows ±[1, -0.25, 0]/|·|: all found
    assert centered(vectors["en"]) == pytest.approx(torch.tensor([[0.5**0.5, -(0.5**0.5), 0.0],
                                                                  [-(0.5**0.5), 0.5**0.5, 0.0]]),
                                                    abs=1e-6)  # fmt: skip
    assert xlingual_retrieval(encode, pairs, "en", center=True)["xx"] == 1.0
    # both from one encoding of each side
    calls = []
    both = xlingual_retrievals(lambda t, lang, side="pivot": calls.append(lang) or vectors[lang],
                               pairs, "en")  # fmt: skip
    assert calls == ["xx", "en"]
    assert both[False]["xx"] == pytest.approx(0.75) and both[True]["xx"] == 1.0


def test_eval_xret_center_labels_its_rows(tiny_world, xlco_run, capsys):
    from mmptm.cli import main

    shards = f"{tiny_world}/parallel/test-*.tar"
    assert main(["eval", "xret", str(xlco_run), "--shards", shards, "--pooling", "mean",
                 "--center"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(result) == ["mean, layer 3 of 3, centered"]
    want = evaluate_xlingual_vectors(str(xlco_run), shards, poolings=["mean"], center=True)
    assert result == want
