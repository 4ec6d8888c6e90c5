"""`mmptm demo knowledge` end to end at toy sizes."""

from __future__ import annotations

import json

import pytest

from mmptm.cli import main
from mmptm.eval.cloze import evaluate_cloze
from mmptm.models.run import load_run_config
from mmptm.studies.knowledge import CLOZE_WORDINGS, GROUPS


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
    assert set(runs["ernie_vl_tiny with graph"]) == {"kvqa"}
    assert all(0 <= runs["ernie_vl_tiny without graph"]["kvqa"][g] <= 1 for g in GROUPS)
    printed = capsys.readouterr().out
    assert "ernie_tiny without graph" in printed and "graph toys" in printed
    assert (out / "curves.png").stat().st_size > 0
