"""The knowledge recipes (ERNIE, KEPLER, K-BERT, VL + entities) on a miniature knowledge
world: each trains (finite loss that falls on a repeated batch, a gradient on every weight),
with and without the graph through its one switch."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from conftest import tiny_overrides
from kworld import write_knowledge_world

from mmptm.data.pipeline import Loader, stream_config
from mmptm.encoders.base import VocabInfo
from mmptm.models.load import build_model
from mmptm.models.pretrain import data_transforms
from mmptm.recipe import load_run_config
from mmptm.tokenizers.sentencepiece import train_tokenizer


@pytest.fixture(scope="module")
def kworld(tmp_path_factory) -> Path:
    root = write_knowledge_world(tmp_path_factory.mktemp("kworld"))
    shards = sorted((root / "knowledge" / "text").glob("train-*.tar"))
    train_tokenizer(shards, root / "tokenizer", vocab_size=60, seed=0, num_threads=1)
    return root


def _setup(recipe: str, world: Path, out: Path, *extra: str):
    over = tiny_overrides(world, out, recipe) + list(extra)  # (it points every path at world)
    cfg = load_run_config(recipe, over)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    vocab = VocabInfo.from_tokenizer(tok)
    stream = stream_config(
        cfg.data, tok, needs=model.data_needs(), transforms=data_transforms(cfg.model, vocab)
    )
    return model, next(iter(Loader(stream, 0)))


def _train(model, batch, steps: int = 15) -> list[dict]:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    model.train()
    history = []
    for _ in range(steps):
        out = model(batch)
        assert torch.isfinite(out.loss)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        history.append(
            {k: float(v) for k, v in out.terms.items()} | {"loss": float(out.loss.detach())}
        )
    return history


def test_ernie_tiny_trains_with_every_weight_and_learns(kworld, tmp_path):
    model, batch = _setup("ernie_tiny", kworld, tmp_path)
    assert (batch["entity_labels"] >= 0).sum() > 0 and "mlm_labels" in batch
    out = model(batch)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters()
               if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]  # fmt: skip
    assert not missing, f"no gradient reaches {missing}"
    assert not model.fusion.entities.table.weight.requires_grad  # frozen TransE vectors
    model.zero_grad()
    h = _train(model, batch)
    assert h[-1]["loss"] < 0.7 * h[0]["loss"]
    assert h[-1]["dea_loss"] < h[0]["dea_loss"]


def test_ernie_without_the_graph(kworld, tmp_path):
    model, batch = _setup("ernie_tiny", kworld, tmp_path, "model.fusion.knowledge=false")
    out = model(batch)
    assert "mlm_loss" in out.terms and not any(k.startswith("dea") for k in out.terms)
    # same architecture: the entity table and K-Encoder are there, they just see no entity
    with_graph, _ = _setup("ernie_tiny", kworld, tmp_path / "g")
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in with_graph.parameters()
    )
    model.eval()
    none = dict(batch, entity_ids=torch.full_like(batch["entity_ids"], -1))
    torch.testing.assert_close(model.fuse(batch).hidden["text"], model.fuse(none).hidden["text"])


def _sources(recipe: str, world: Path, out: Path, *extra: str):
    """The model and one batch of each data source of a mixture recipe."""
    over = tiny_overrides(world, out, recipe) + list(extra)
    cfg = load_run_config(recipe, over)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    vocab = VocabInfo.from_tokenizer(tok)
    stream = stream_config(
        cfg.data, tok, needs=model.data_needs(), transforms=data_transforms(cfg.model, vocab)
    )
    batches = {}
    for _, b in zip(range(30), Loader(stream, 0)):
        batches.setdefault(b["__source__"], b)
    return model, tok, cfg, batches


def test_kepler_tiny_trains_both_objectives(kworld, tmp_path):
    model, _tok, _cfg, batches = _sources("kepler_tiny", kworld, tmp_path)
    assert set(batches) == {"text", "triples"}
    assert batches["triples"]["input_ids"].shape[0] == 16  # 8 heads, then their 8 tails
    terms = {s: model(b).terms for s, b in batches.items()}
    assert set(terms["text"]) == {"mlm_loss", "mlm_acc"}  # routes: MLM on text only
    assert "ke_loss" in terms["triples"] and "mlm_loss" not in terms["triples"]
    for b in batches.values():
        model(b).loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient reaches {missing}"
    h = _train(model, batches["triples"], steps=15)
    assert h[-1]["ke_loss"] < 0.7 * h[0]["ke_loss"]


def test_kepler_without_the_graph_is_mlm_alone(kworld, tmp_path):
    _, _, _, batches = _sources("kepler_tiny", kworld, tmp_path, "data.sources.triples.weight=0")
    assert set(batches) == {"text"}


@pytest.mark.parametrize("score", ["transe", "rotate"])
def test_kepler_link_prediction_ranks_like_brute_force(kworld, tmp_path, score):
    from mmptm.eval.kepler import encode_texts, kepler_link_prediction
    from mmptm.kg.graph import load_graph, read_descriptions

    model, tok, cfg, _ = _sources(
        "kepler_tiny", kworld, tmp_path, f"model.objectives.ke.model={score}"
    )
    graph = kworld / "knowledge" / "graph"
    got = kepler_link_prediction(model, tok, cfg, graph, split="train")
    kg = load_graph(graph)
    text = read_descriptions(graph / "descriptions.txt")
    model.eval()
    E = encode_texts(model, tok, cfg, [text[n] for n in kg.entities.names]).double()
    R = model.objectives["ke"].relations.weight.detach().double()  # graph order = file order
    if score == "rotate":  # the table holds θ · 0.1 / π (RotatE's scaled phases)
        R = R * math.pi / 0.1
    known = {tuple(t) for t in kg.splits["train"].tolist()}

    def reciprocal_rank(s, gold, others):  # realistic rank among the unfiltered candidates
        better = [e for e in others if e != gold and s[e] > s[gold]]
        ties = [e for e in others if e != gold and s[e] == s[gold]]
        return 1 / (1 + len(better) + len(ties) / 2)

    K = E.shape[1] // 2  # RotatE: torch's complex numbers, not the [re | im] code under test
    C = torch.complex(E[:, :K], E[:, K:])

    def score_of(h, r, t):  # −d(h, r, t), broadcast over an index tensor on one side
        if score == "rotate":
            return -(C[h] * torch.polar(torch.ones_like(R[r]), R[r]) - C[t]).abs().sum(-1)
        return -(E[h] + R[r] - E[t]).abs().sum(-1)

    every = torch.arange(len(E))
    rr, per_relation = [], {}
    for h, r, t in kg.splits["train"].tolist():
        tail = reciprocal_rank(score_of(h, r, every), t,
                               [e for e in range(len(E)) if (h, r, e) not in known])  # fmt: skip
        head = reciprocal_rank(score_of(every, r, t), h,
                               [e for e in range(len(E)) if (e, r, t) not in known])  # fmt: skip
        rr.append(tail)
        per_relation.setdefault(kg.relations.names[r], []).extend([tail, head])
    assert got["tail"]["mrr"] == pytest.approx(sum(rr) / len(rr), rel=1e-4)
    assert set(got["by_relation"]) == set(per_relation) == {"made_of", "owned_by"}
    for name, rrs in per_relation.items():
        assert got["by_relation"][name]["count"] == len(rrs)
        assert got["by_relation"][name]["mrr"] == pytest.approx(sum(rrs) / len(rrs), rel=1e-4)
    assert got["entities"] == len(kg.entities) and got["no_description"] == 0


def test_ernie_vl_tiny_entities_on_text_and_regions(kworld, tmp_path):
    model, batch = _setup("ernie_vl_tiny", kworld, tmp_path)
    assert batch["region_entity_ids"].shape == batch["region_mask"].shape
    assert (batch["region_entity_labels"][:, 1] == -1).all()  # the region without an entity
    assert (batch["region_entity_labels"][:, 0] >= 0).all()
    out = model(batch)
    assert {"itm_loss", "mlm_loss", "dea_loss"} <= set(out.terms)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters()
               if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]  # fmt: skip
    assert not missing, f"no gradient reaches {missing}"
    model.zero_grad()
    h = _train(model, batch)
    assert h[-1]["loss"] < 0.7 * h[0]["loss"]
    off, batch = _setup("ernie_vl_tiny", kworld, tmp_path / "off", "model.fusion.knowledge=false")
    assert "dea_loss" not in off(batch).terms


def _kbert(world: Path, out: Path, *extra: str):
    over = tiny_overrides(world, out, "kbert_tiny") + list(extra)
    cfg = load_run_config("kbert_tiny", over)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    vocab = VocabInfo.from_tokenizer(tok)
    stream = stream_config(
        cfg.data, tok, needs=model.data_needs(), transforms=data_transforms(cfg.model, vocab)
    )
    return model, next(iter(Loader(stream, 0)))


def test_kbert_tiny_injects_and_learns(kworld, tmp_path):
    model, batch = _kbert(kworld, tmp_path)
    assert batch["injected_mask"].any() and batch["visible_mask"].dim() == 3
    assert not ((batch["mlm_labels"] != -100) & batch["injected_mask"]).any()
    out = model(batch)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient reaches {missing}"
    h = _train(model, batch)
    assert h[-1]["loss"] < 0.7 * h[0]["loss"]
    plain, plain_batch = _kbert(kworld, tmp_path / "off", "model.fusion.knowledge=false")
    assert not plain_batch["injected_mask"].any()  # nothing injected, same model
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in model.parameters())


def test_kbert_one_layer_leaves_tokens_outside_mentions_as_without_branches(kworld, tmp_path):
    """With one layer, a sentence token outside every mention sees neither the branches nor
    (through the entity) what they hold: its output equals the plain sentence's."""
    model, batch = _kbert(kworld, tmp_path, "model.fusion.transformer.layers=1")
    model.eval()
    b = 0
    keep = batch["attention_mask"][b] & ~batch["injected_mask"][b]
    plain = {k: batch[k][b : b + 1, keep] for k in ("input_ids", "attention_mask", "position_ids",
                                                    "segment_ids", "lang_ids")}  # fmt: skip
    with torch.no_grad():
        tree = model.fuse({k: v[b : b + 1] for k, v in batch.items() if torch.is_tensor(v)})
        alone = model.fuse(plain)
    outside = ~batch["entity_mask"][b, keep]
    got = tree.hidden["text"][0, keep][outside]
    torch.testing.assert_close(got, alone.hidden["text"][0][outside], atol=1e-5, rtol=1e-5)
    inside = batch["entity_mask"][b, keep]
    assert not torch.allclose(tree.hidden["text"][0, keep][inside], alone.hidden["text"][0][inside])


def test_kepler_through_the_command_line(kworld, tmp_path, capsys):
    """`mmptm data triples`, `mmptm pretrain kepler_tiny`, `mmptm eval link-prediction`."""
    from conftest import cli_error

    from mmptm.cli import main

    k = kworld / "knowledge"
    assert main(["data", "triples", str(k / "graph"), "--out", str(tmp_path / "triples")]) == 0
    assert '"triples": 10' in capsys.readouterr().out
    assert (tmp_path / "triples" / "relations.txt").read_text() == "made_of\nowned_by\n"
    run = tmp_path / "run"
    over = tiny_overrides(kworld, run, "kepler_tiny")
    over = [o for o in over if not o.startswith("data.sources.triples.shards")]
    over += [f"data.sources.triples.shards={tmp_path}/triples/train-*.tar",
             f"model.objectives.ke.relations={tmp_path}/triples/relations.txt"]  # fmt: skip
    assert main(["pretrain", "kepler_tiny", *over]) == 0
    capsys.readouterr()
    argv = ["eval", "link-prediction", str(run), "--graph", str(k / "graph"), "--split", "train"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "train both: MRR" in out and '"no_description": 0' in out
    assert re.search(r"^  made_of : MRR [0-9.]+ .*queries\)$", out, re.M)  # a row per relation
    err = cli_error(capsys, ["data", "triples", str(tmp_path / "nowhere"), "--out", str(tmp_path)])
    assert "nowhere" in err
