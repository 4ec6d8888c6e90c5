"""`mmptm demo captioning` end to end at toy sizes: VLP and mBART pre-trained and from
scratch, fine-tuned to write, scored beside the translation baselines."""

from __future__ import annotations

import json

import pytest

from mmptm.cli import main


@pytest.mark.slow
def test_captioning_study_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "captioning", "--out", str(out), "--recipes", "vlp_tiny,mbart_tiny",
            "--n-train", "32", "--n-test", "8", "--steps", "3", "--ft-steps", "3",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "results.json").read_text())
    starts = ("pre-trained", "from scratch")
    want = {f"vlp_tiny {s}, {d}" for s in starts for d in ("greedy", "beam 3")}
    assert set(result["captioning"]) == want
    for r in result["captioning"].values():
        assert r["n"] == 8 and 0 <= r["cider_d"] and 0 <= r["bleu4"] <= 100
        assert set(r["baselines"]) == {"most frequent caption"}
    assert "baseline: most frequent caption" in printed
    for pair in ("en→de", "en→ru"):
        rows = result["translation"][pair]
        assert len(rows) == 4
        base = next(iter(rows.values()))["baselines"]
        # the dictionary learnt from the training pairs beats copying English
        assert base["dictionary"]["chrf"] > base["copy"]["chrf"]
    assert "translation en→ru" in printed and "dictionary" in printed
    assert (out / "curves.png").is_file()
