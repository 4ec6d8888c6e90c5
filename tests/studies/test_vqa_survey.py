"""`mmptm demo vqa` with the issue-35 rows at toy size: UNITER with word–region alignment,
LXMERT with image QA on the study's questions and answer list, VL-BERT (no matching head, no
retrieval row), Unicoder-VL, ImageBERT and B2T2, pre-trained and fine-tuned for VQA."""

from __future__ import annotations

import json

import pytest

from mmptm.cli import main
from mmptm.recipe import load_run_config
from mmptm.studies.vqa import VL_RECIPES

NEW = ("uniter_full_tiny", "lxmert_full_tiny", "vlbert_tiny", "unicoder_vl_tiny",
       "imagebert_tiny", "b2t2_tiny")  # fmt: skip


@pytest.mark.slow
def test_demo_vqa_runs_the_survey_rows(tmp_path):
    assert set(NEW) <= set(VL_RECIPES)
    out = tmp_path / "demo"
    argv = ["demo", "vqa", "--out", str(out), "--n-train", "48", "--n-test", "12",
            "--steps", "3", "--ft-steps", "2", "--seeds", "1", "--recipes", ",".join(NEW),
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert set(result["retrieval"]) == set(NEW) - {"vlbert_tiny"}
    assert all(r["n"] == 12 and r["fused_pairs"] == 144 for r in result["retrieval"].values())
    assert set(result["vqa_mean"]) == {f"{r} {s}" for r in NEW
                                       for s in ("pre-trained", "from scratch")}  # fmt: skip
    assert all(0 <= a <= 100 for a in result["vqa_mean"].values())
    # ImageBERT and Unicoder-VL fine-tune UNITER's architecture: from scratch, UNITER's runs
    scratch = "uniter_full_tiny from scratch"
    assert result["same_runs"] == {f"{r} from scratch": scratch
                                   for r in ("imagebert_tiny", "unicoder_vl_tiny")}  # fmt: skip
    for r in ("imagebert_tiny", "unicoder_vl_tiny"):
        assert result["vqa_per_seed"][f"{r} from scratch"] == result["vqa_per_seed"][scratch]
        assert not (out / f"vqa_{r}_from_scratch_0").exists()
    shares = result["budget"]["uniter_full_tiny"]["objectives"]
    assert shares == {"itm": 1 / 3, "mlm": 1 / 3, "mrc_kl": 1 / 6, "mrfr": 1 / 6, "wra": 1 / 3}
    assert result["budget"]["lxmert_full_tiny"]["objectives"]["vqa"] == 1.0
    # LXMERT's questions and answer list are the study's
    lxmert = load_run_config(str(out / "lxmert_full_tiny" / "config.yaml"))
    data = out / "toyworld"
    assert lxmert.data.sources["questions"].shards == f"{data}/vqa/train-*.tar"
    assert lxmert.model.objectives["vqa"].answers == f"{data}/vqa/answers.txt"
