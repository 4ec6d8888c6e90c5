"""`mmptm demo knowledge` with KnowBERT and ERNIE 1.0 at toy sizes: the candidate shards are
prepared, KnowBERT's row carries its linking accuracy beside the prior's, its run without
the graph none; ERNIE 1.0's "without" run is BERT's masking."""

from __future__ import annotations

import json

import pytest

from mmptm.cli import main
from mmptm.recipe import load_run_config


@pytest.mark.slow
def test_demo_knowledge_knowbert_and_ernie1(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "knowledge", "--out", str(out), "--n-train", "48", "--n-test", "16",
            "--steps", "3", "--ft-steps", "2", "--recipes", "knowbert_tiny,ernie1_tiny",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    link = runs["knowbert_tiny with graph"]["linking"]
    assert link["spans"] > 0 and 0 <= link["acc"] <= 1 and 0 < link["prior_acc"] < 1
    assert "linking" not in runs["knowbert_tiny without graph"]
    typing = load_run_config(str(out / "knowbert_tiny_graph_typing" / "config.yaml"))
    assert "/typing/candidates/" in typing.data.train  # fine-tuned with its candidate spans
    without = load_run_config(str(out / "ernie1_tiny_nograph" / "config.yaml"))
    mlm = without.model.objectives["mlm"]
    assert (mlm.mask_spans, mlm.mask_phrases, mlm.mask_prob) == ("", "", 0.15)
    assert "linking accuracy" in capsys.readouterr().out
