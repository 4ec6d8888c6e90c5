"""`mmptm demo knowledge` end to end at toy sizes."""

from __future__ import annotations

import json

import pytest
import torch

from mmptm import toyworld
from mmptm.cli import main
from mmptm.eval.cloze import evaluate_cloze
from mmptm.recipe import load_run_config
from mmptm.studies.knowledge import (
    CLOZE_WORDINGS,
    GROUPS,
    LANGS,
    swapped_toys,
    visual_cloze_queries,
)
from tests.conftest import read_shard_samples


@pytest.mark.slow
def test_demo_knowledge_with_and_without_the_graph(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "knowledge", "--out", str(out), "--n-train", "48", "--n-test", "16",
            "--steps", "3", "--ft-steps", "2",
            "--recipes", "ernie_tiny,kbert_tiny,kepler_tiny,ernie_vl_tiny",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    runs = result["runs"]
    recipes = ("ernie_tiny", "kbert_tiny", "kepler_tiny", "ernie_vl_tiny")
    assert list(runs) == [f"{r} {g}" for r in recipes for g in ("with graph", "without graph")]
    for name in [n for n in runs if not n.startswith("ernie_vl")]:
        row = runs[name]
        assert set(row) == {"cloze", "typing", "relations"}
        for wording in CLOZE_WORDINGS:
            langs = row["cloze"][wording]["per_language"]
            assert sorted(langs) == ["de", "en", "es", "fr", "ru"]
            for g in GROUPS:  # the mean over languages of each group
                assert row["cloze"][wording][g] == pytest.approx(
                    sum(v[g] for v in langs.values()) / 5
                )
        for task in ("typing", "relations"):
            assert all(0 <= row[task][g] <= 1 for g in GROUPS)
    # the cloze numbers are what the probe gives on the run, in the training text's wording
    run = out / "ernie_tiny_graph"
    probe = out / "toyworld" / "knowledge" / "probe" / "cloze.de.jsonl"
    direct = evaluate_cloze(str(run), str(probe), sentence=CLOZE_WORDINGS["text wording"])
    row = runs["ernie_tiny with graph"]["cloze"]["text wording"]["per_language"]["de"]
    assert row == {g: direct["by_facts"][g]["p@1"] for g in GROUPS}
    # the same architecture, with and without the graph's vectors
    with_graph = load_run_config(str(run / "config.yaml"))
    without = load_run_config(str(out / "ernie_tiny_nograph" / "config.yaml"))
    assert (with_graph.model.fusion.knowledge, without.model.fusion.knowledge) == (True, False)
    assert set(runs["ernie_vl_tiny with graph"]) == {"visual_cloze", "visual_cloze_swapped", "kvqa"}
    for g in GROUPS:
        assert 0 <= runs["ernie_vl_tiny without graph"]["visual_cloze"][g] <= 1
    assert all(0 <= runs["ernie_vl_tiny without graph"]["kvqa"][g] <= 1 for g in GROUPS)
    printed = capsys.readouterr().out
    assert "ernie_tiny without graph" in printed and "graph toys" in printed
    assert (out / "curves.png").stat().st_size > 0


@pytest.fixture(scope="module")
def kdata(tmp_path_factory):
    root = tmp_path_factory.mktemp("vc") / "tw"
    toyworld.generate(root, n_train=8, n_val=4, n_test=24, image_size=32, shard_size=50,
                      languages=LANGS, views=("knowledge",))  # fmt: skip
    return root


def test_visual_cloze_queries_ask_each_pictured_toy_its_facts(kdata):
    k = kdata / "knowledge"
    toys = {t["id"]: t for t in json.loads((k / "graph" / "toys.json").read_text())}
    values = json.loads((k / "graph" / "values.json").read_text())
    shards = sorted(str(p) for p in k.glob("image_text/test-*.tar"))
    scenes = [json.loads(s["json"]) for _, s in read_shard_samples(shards)]
    queries = visual_cloze_queries(kdata, 0, scenes=10)
    assert len(queries) == 3 * sum(len(m["region_entities"]) for m in scenes[:10])
    q = iter(queries)
    for meta in scenes[:10]:
        names = meta["captions"]["en"].split(". ", 1)[1] if meta["caption_fact"] else None
        for entity in meta["region_entities"]:
            toy = toys[entity]
            for relation in ("made_of", "owned_by", "comes_from"):
                query = next(q)
                assert (query["entity"], query["relation"]) == (entity, relation)
                assert query["facts"] == ("text" if toy["facts_in_text"] else "graph")
                candidates = [v for v in values if v["relation"] == relation]
                assert len(query["samples"]) == len(candidates)
                for sample, value in zip(query["samples"], candidates):
                    text, js = sample["txt"], sample["json"]
                    assert text.startswith(f"The {toy['color']} {toy['shape']} ")
                    ((a, b, _),) = js["cloze"]["en"]
                    assert text[a:b] == value["names"]["en"]
                    if names is not None:  # the scene's own fact gave way to this one
                        assert text.endswith(names) and text.count(". ") == 1
                    assert js["captions"]["en"] == text
                    for s, e, who in js["mentions"]["en"]:
                        assert text[s:e] == toys[who]["names"]["en"] and who in js["toys"]
                    assert js["region_entities"] == meta["region_entities"]
                    assert sample["jpg"] and sample["regions.npz"]
                gold = candidates[query["gold"]]["id"]
                assert gold == toy["facts"][relation]


def test_visual_cloze_ranks_the_gold_value(kdata, monkeypatch):
    """P@1 from the scores: the gold scored highest → 1; every candidate alike → 0 (a tie
    ranks the gold in the middle); the groups split the queries."""
    import mmptm.studies.knowledge as study

    queries = visual_cloze_queries(kdata, 0, scenes=6)
    gold = {s["__key__"] for q in queries for i, s in enumerate(q["samples"]) if i == q["gold"]}
    monkeypatch.setattr(study, "load_pretrained", lambda run: (torch.nn.Linear(1, 1), None, None))
    for score, want in ((lambda k: 0.0 if k in gold else -1.0, 1.0), (lambda k: -1.0, 0.0)):
        monkeypatch.setattr(
            study, "score_queries",
            lambda net, cfg, tok, samples, text_only, f=score: {
                s["__key__"]: (f(s["__key__"]), 1) for s in samples},
        )  # fmt: skip
        r = study.visual_cloze(kdata / "run", kdata, 0, scenes=6)
        assert r["overall"]["p@1"] == want and r["overall"]["n"] == len(queries)
        n = {g: sum(q["facts"] == g for q in queries) for g in GROUPS}
        assert {g: r["by_facts"][g]["n"] for g in GROUPS} == n and min(n.values()) > 0
        assert r["text"] == r["by_facts"]["text"]["p@1"] == want


def test_visual_cloze_with_swapped_entities_asks_the_swapped_in_toy(kdata):
    """The pictured toy keeps its looks in the sentence; its region (and every name mention)
    carries another toy's entity, whose fact is the gold."""
    toys = json.loads((kdata / "knowledge" / "graph" / "toys.json").read_text())
    by_id = {t["id"]: t for t in toys}
    values = json.loads((kdata / "knowledge" / "graph" / "values.json").read_text())
    swap = swapped_toys(0)
    assert sorted(swap) == sorted(swap.values()) == sorted(by_id)  # a permutation of the toys
    plain = visual_cloze_queries(kdata, 0, scenes=8)
    swapped = visual_cloze_queries(kdata, 0, scenes=8, swap_entities=True)
    assert len(plain) == len(swapped)
    moved = 0
    for p, q in zip(plain, swapped):
        assert q["entity"] != p["entity"] and q["relation"] == p["relation"]
        toy = by_id[q["entity"]]
        assert q["facts"] == ("text" if toy["facts_in_text"] else "graph")
        candidates = [v for v in values if v["relation"] == q["relation"]]
        assert candidates[q["gold"]]["id"] == toy["facts"][q["relation"]]
        for a, b in zip(p["samples"], q["samples"]):
            assert a["txt"] == b["txt"]  # the same words: the pictured toy's looks
            before, after = a["json"]["region_entities"], b["json"]["region_entities"]
            assert after.index(q["entity"]) == before.index(p["entity"])
            pairs = list(zip(before, after)) + [
                (x[2], y[2])
                for x, y in zip(a["json"]["mentions"]["en"], b["json"]["mentions"]["en"])
            ]
            assert all(x != y and by_id[y]["names"]["en"] for x, y in pairs)
            assert all(swap[x] == y for x, y in pairs)
        moved += p["gold"] != q["gold"]
    assert moved > len(plain) // 3
