"""VQA end to end on tiny toyworld: UNITER pre-training → answer vocabulary → fine-tuning → eval."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_overrides

from mmptm.cli import main
from mmptm.converters.answers import read_answer_vocab
from mmptm.eval.vqa import evaluate_vqa
from mmptm.objectives.vqa import soft_score
from mmptm.recipe import load_run_config
from mmptm.train.trainer import pretrain


@pytest.mark.slow
def test_vqa_fine_tuning_from_a_uniter_checkpoint(tiny_world, tmp_path):
    pre = tmp_path / "uniter"
    pretrain(
        load_run_config(
            "uniter_tiny",
            [*tiny_overrides(tiny_world, pre, "uniter_tiny"), "train.max_steps=4"],
        )
    )
    answers = tmp_path / "answers.txt"
    assert main(["data", "answers", "--input", f"{tiny_world}/vqa/train-*.tar",
                 "--out", str(answers), "--min-count", "1"]) == 0  # fmt: skip
    vocab = read_answer_vocab(answers)
    assert {"yes", "no", "1", "2", "red", "circle"} <= set(vocab)
    run = tmp_path / "vqa"
    cfg = load_run_config(
        "vqa",
        [
            f"init={pre}",
            f"output_dir={run}",
            f"data.train={tiny_world}/vqa/train-*.tar",
            f"data.test={tiny_world}/vqa/test-*.tar",
            f"model.objectives.vqa.answers={answers}",
            "data.batch_size=8",
            "data.num_workers=0",
            "train.max_steps=3",
            "train.progress=false",
        ],
    )
    pretrain(cfg)
    saved = load_run_config(str(run / "config.yaml"))  # the architecture came from init
    assert saved.model.encoders["regions"].feature_dim == 64 and "vqa" in saved.model.objectives
    results = tmp_path / "results.json"
    r = evaluate_vqa(str(run), split="test", results_file=results)
    predictions = json.loads(results.read_text())
    assert r["predicted"] == len(predictions) == r["scored"] > 0
    assert all(set(p) == {"question_id", "answer"} and p["answer"] in vocab for p in predictions)
    # The reported accuracy is the official soft score of those predictions (recomputed here
    # from the shards' raw answers).
    from mmptm.data.shards import SkipCounter, expand_shards, tar_samples

    truth, kind = {}, {}
    for s in tar_samples(expand_shards(f"{tiny_world}/vqa/test-*.tar"), SkipCounter()):
        meta = json.loads(s["json"])
        truth[meta["question_id"]] = meta["answers"]
        kind[meta["question_id"]] = meta["answer_type"]
    score = {q["question_id"]: soft_score(truth[q["question_id"]], q["answer"])
             for q in predictions}  # fmt: skip
    assert r["accuracy"] == pytest.approx(100 * sum(score.values()) / len(predictions))
    # per answer type (the official perAnswerType), also from the raw shards
    assert set(r["per_answer_type"]) == set(kind.values()) == {"yes/no", "number", "other"}
    for t, acc in r["per_answer_type"].items():
        ours = [score[q] for q in score if kind[q] == t]
        assert acc == pytest.approx(100 * sum(ours) / len(ours))
