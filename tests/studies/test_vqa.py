"""`mmptm demo vqa` end to end at toy sizes: Oscar (matching over tags) and ALBEF (three
retrieval rankings) beside VQA from pre-trained and from scratch; the runs' budgets."""

from __future__ import annotations

import json

import pytest

from mmptm.cli import main
from mmptm.models.load import build_model
from mmptm.recipe import load_run_config
from mmptm.studies.vqa import VL_RUNS, model_budget

#: one pre-norm block at width 128, MLP 512: attention 4·128² + 4·128, MLP 2·128·512 + 512 +
#: 128, two layer norms 4·128; after the stack its closing layer norm 2·128 and the pooler
#: 128² + 128
BLOCK_128 = 4 * 128 * 128 + 4 * 128 + 2 * 128 * 512 + 512 + 128 + 4 * 128
CLOSING_128 = 2 * 128 + 128 * 128 + 128


def test_the_equal_budget_single_stream_matches_vilbert_s_fusion_and_trains_every_objective(
    tiny_world,
):
    budgets = {}
    for name in ("uniter_tiny", "single_stream_9l", "vilbert_tiny"):
        recipe, variant = VL_RUNS[name]
        over = [f"data.tokenizer={tiny_world}/tokenizer.model", *variant]
        cfg = load_run_config(recipe, [*over, "data.batch_size=64"])
        budgets[name] = model_budget(build_model(cfg)[0], cfg)
    uniter, equal = budgets["uniter_tiny"], budgets["single_stream_9l"]
    assert uniter["fusion_parameters"] == 4 * BLOCK_128 + CLOSING_128
    assert equal["fusion_parameters"] == 9 * BLOCK_128 + CLOSING_128
    # within 2% of ViLBERT's two streams with co-attention
    vilbert = budgets["vilbert_tiny"]["fusion_parameters"]
    assert abs(equal["fusion_parameters"] - vilbert) / vilbert < 0.02
    # UNITER samples one task per step, 2 : 2 : 1 : 1; the variant trains all four every step
    assert uniter["objectives"] == {"itm": 1 / 3, "mlm": 1 / 3, "mrc_kl": 1 / 6, "mrfr": 1 / 6}
    assert equal["objectives"] == {"itm": 1.0, "mlm": 1.0, "mrc_kl": 1.0, "mrfr": 1.0}
    assert equal["parameters"] > equal["fusion_parameters"] and equal["batch_size"] == 64


@pytest.mark.slow
def test_demo_vqa_ranks_oscar_by_its_tags_head_and_albef_three_ways(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "vqa", "--out", str(out), "--n-train", "48", "--n-test", "12",
            "--steps", "3", "--ft-steps", "2", "--seeds", "1",
            "--recipes", "oscar_tiny,albef_tiny,single_stream_9l",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    n = 12  # every test pair
    # what each ranking cost in fused pairs: Oscar's matching head over every pair; ALBEF's
    # contrastive stage none, its ITM over every pair n², its re-ranking 2 · n · min(16, n)
    cost = {
        "oscar_tiny": n * n,
        "albef_tiny, contrastive": 0,
        "albef_tiny, ITM over all pairs": n * n,
        "albef_tiny, top 16 re-ranked": 2 * n * n,
        "single_stream_9l": n * n,
    }
    assert {k: (r["n"], r["fused_pairs"]) for k, r in result["retrieval"].items()} == {
        k: (n, c) for k, c in cost.items()
    }
    assert set(result["vqa_mean"]) == {
        f"{r} {how}"
        for r in ("oscar_tiny", "albef_tiny", "single_stream_9l")
        for how in ("pre-trained", "from scratch")
    }
    assert list(result["budget"]) == ["oscar_tiny", "albef_tiny", "single_stream_9l"]
    assert result["budget"]["single_stream_9l"]["fusion_parameters"] == 9 * BLOCK_128 + CLOSING_128
    assert all(0 <= a <= 100 for a in result["vqa_mean"].values())  # percent
    printed = capsys.readouterr().out
    assert "albef_tiny, top 16 re-ranked" in printed and "oscar_tiny" in printed
    assert "single_stream_9l" in printed and "1.80M" in printed
    # run again: every run is finished, and no retrieval is scored again
    stored = {p: p.stat().st_mtime_ns for p in (out / "evaluations").glob("retrieval_*.json")}
    assert len(stored) == 3
    assert main(argv) == 0
    assert json.loads((out / "results.json").read_text())["retrieval"] == result["retrieval"]
    assert {p: p.stat().st_mtime_ns for p in stored} == stored


@pytest.mark.slow
def test_demo_vqa_without_retrieval_fine_tunes_only(tmp_path):
    out = tmp_path / "demo"
    argv = ["demo", "vqa", "--out", str(out), "--n-train", "48", "--n-test", "12",
            "--steps", "2", "--ft-steps", "2", "--seeds", "1", "--retrieval-items", "0",
            "--recipes", "visualbert_tiny",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["retrieval"] == {} and result["settings"]["retrieval_items"] == 0
    assert set(result["vqa_mean"]) == {
        "visualbert_tiny pre-trained",
        "visualbert_tiny from scratch",
    }
    assert result["budget"]["visualbert_tiny"]["objectives"] == {"itm": 1.0, "mlm": 1.0}
