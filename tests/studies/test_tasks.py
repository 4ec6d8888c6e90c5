"""The task study over seeds (``mmptm demo tasks``): a tiny smoke run of every task, and the
mean ± std against the statistics module's definitions by hand."""

from __future__ import annotations

import json
import math

import pytest

from mmptm.studies.tasks import TASKS, format_tasks, summary, tasks_study


def test_summary_by_hand():
    s = summary([70.0, 80.0, 90.0])
    # mean 80; sample variance ((-10)² + 0 + 10²) / 2 = 100
    assert s == {"per_seed": [70.0, 80.0, 90.0], "mean": 80.0, "std": 10.0}
    assert summary([5.0]) == {"per_seed": [5.0], "mean": 5.0, "std": 0.0}


def test_unknown_task_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="unknown tasks \\['vcr9'\\]; choices: refexp, nlvr2"):
        tasks_study(tmp_path, recipes=("vcr9",))


def test_every_task_pretrained_and_from_scratch_over_two_seeds(tmp_path, capsys):
    """Two pre-training steps, two fine-tuning steps a run: every task, both starts, two seeds,
    and the scores of each run in results.json (8 s on a 2-core CPU, 25 s when it is loaded)."""
    shrink = [
        "model.width=32",
        "model.fusion.transformer.layers=2",
        "model.fusion.transformer.heads=2",
        "data.batch_size=4",
        "data.shuffle_buffer=20",
    ]
    result = tasks_study(tmp_path, recipes=TASKS, n_train=16, n_test=4, n_task_train=8,
                         steps=2, ft_steps=2, seeds=(0, 1), overrides=shrink,
                         ft_overrides=["data.batch_size=4", "data.shuffle_buffer=20"])  # fmt: skip
    assert list(result["tasks"]) == list(TASKS)
    want = {"refexp": ["accuracy"], "nlvr2": ["accuracy"], "vcr": ["q_a", "qa_r", "q_ar"],
            "tagging": ["f1 en", "f1 avg"],
            "qa": ["f1 en", "f1 avg"], "xnli": ["acc en", "acc avg"]}  # fmt: skip
    for task, metrics in want.items():
        assert list(result["tasks"][task]) == metrics
        for by in result["tasks"][task].values():
            assert set(by) == {"pre-trained", "from scratch"}
            for s in by.values():
                assert len(s["per_seed"]) == 2 and all(0 <= v <= 100 for v in s["per_seed"])
                assert math.isclose(s["mean"], sum(s["per_seed"]) / 2)
    vcr = {m: result["tasks"]["vcr"][m]["pre-trained"]["per_seed"] for m in want["vcr"]}
    for q_a, qa_r, q_ar in zip(vcr["q_a"], vcr["qa_r"], vcr["q_ar"]):
        assert q_ar <= min(q_a, qa_r)  # a question counts for Q→AR only when both picks are right
    assert json.loads((tmp_path / "results.json").read_text())["tasks"] == result["tasks"]
    table = capsys.readouterr().out
    assert format_tasks(result) in table and "mean ± std over 2 fine-tuning seed(s)" in table
    assert (tmp_path / "finetune" / "qa_from_scratch_1").is_dir()
