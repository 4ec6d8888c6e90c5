"""`mmptm demo multilingual` end to end at toy sizes."""

from __future__ import annotations

import json

import pytest

from mmptm.cli import main
from mmptm.studies.common import LANGS


@pytest.mark.slow
def test_demo_multilingual_compares_three_pretrainings_and_scratch(tmp_path, capsys):
    """Three pre-trainings scored on cross-lingual retrieval against English, then XNLI
    fine-tuned on English from each and from scratch, scored in every language."""
    out = tmp_path / "demo"
    argv = ["demo", "multilingual", "--out", str(out), "--n-train", "32", "--n-test", "16",
            "--steps", "2", "--ft-steps", "2", "--seeds", "1",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    runs = ["mlm", "mlm+tlm", "mlm+tlm+xlco"]
    assert list(result["xlingual_retrieval"]) == runs
    assert set(result["xlingual_retrieval"]["mlm"]) == {*LANGS[1:], "avg"}  # against English
    assert list(result["xnli_zero_shot_mean"]) == ["from scratch", *runs]
    assert set(result["xnli_zero_shot_mean"]["mlm"]) == {*LANGS, "avg"}
    assert all(len(rows) == 1 for rows in result["xnli_per_seed"].values())
    assert result["settings"] == {"n_train": 32, "steps": 2, "ft_steps": 2, "seeds": [0]}
    printed = capsys.readouterr().out
    assert "Tatoeba protocol" in printed and "mean of 1 seeds" in printed
    assert (out / "curves.png").exists() and (out / "curves_xnli.png").exists()
