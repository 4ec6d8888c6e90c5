"""`mmptm demo vqa` end to end at toy sizes: Oscar (matching over tags) and ALBEF (three
retrieval rankings) beside VQA from pre-trained and from scratch."""

from __future__ import annotations

import json

import pytest

from mmptm.cli import main


@pytest.mark.slow
def test_demo_vqa_ranks_oscar_by_its_tags_head_and_albef_three_ways(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "vqa", "--out", str(out), "--n-train", "48", "--n-test", "12",
            "--steps", "3", "--ft-steps", "2", "--seeds", "1",
            "--recipes", "oscar_tiny,albef_tiny",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    n = 12  # every test pair (fewer than the study's 100)
    # what each ranking cost in fused pairs: Oscar's matching head over every pair; ALBEF's
    # contrastive stage none, its ITM over every pair n², its re-ranking 2 · n · min(16, n)
    cost = {
        "oscar_tiny": n * n,
        "albef_tiny, contrastive": 0,
        "albef_tiny, ITM over all pairs": n * n,
        "albef_tiny, top 16 re-ranked": 2 * n * n,
    }
    assert {k: (r["n"], r["fused_pairs"]) for k, r in result["retrieval"].items()} == {
        k: (n, c) for k, c in cost.items()
    }
    assert set(result["vqa_mean"]) == {
        f"{r} {how}"
        for r in ("oscar_tiny", "albef_tiny")
        for how in ("pre-trained", "from scratch")
    }
    assert all(0 <= a <= 100 for a in result["vqa_mean"].values())  # percent
    printed = capsys.readouterr().out
    assert "albef_tiny, top 16 re-ranked" in printed and "oscar_tiny" in printed
