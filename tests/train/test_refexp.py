"""Referring expressions end to end on a small toyworld: UNITER pre-training → region
selection fine-tuning, pre-trained vs from scratch → accuracy at IoU >= 0.5."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_overrides

from mmptm import toyworld
from mmptm.eval.refexp import evaluate_refexp
from mmptm.recipe import load_run_config
from mmptm.tokenizers.sentencepiece import train_tokenizer
from mmptm.toyworld.refexp import write_refexp
from mmptm.train.trainer import pretrain


def _finetune(data: Path, init: Path, out: Path, *extra: str) -> dict:
    cfg = load_run_config(
        "refcoco",
        [
            f"init={init}", f"output_dir={out}", f"data.train={data}/train-*.tar",
            f"data.val={data}/val-*.tar", f"data.test={data}/test-*.tar",
            "data.batch_size=32", "data.num_workers=0", "data.shuffle_buffer=500",
            "train.max_steps=1500", "train.lr=5e-4", "train.warmup_steps=10",
            "train.log_every=100", "train.ckpt_every=1500", "train.progress=false", *extra,
        ],
    )  # fmt: skip
    pretrain(cfg)
    return evaluate_refexp(str(out), split="test")


@pytest.mark.slow
def test_region_selection_pretrained_and_from_scratch(tmp_path):
    # tiny_world's 96 scenes are too few for UNITER to learn colours and shapes: 2000 here
    world = tmp_path / "world"
    views = ["image_text", "regions"]
    toyworld.generate(world, n_train=2000, n_val=32, n_test=32, seed=0, image_size=32,
                      shard_size=500, languages=("en",), views=views)  # fmt: skip
    shards = sorted((world / "image_text").glob("train-*.tar"))
    train_tokenizer(shards, world / "tokenizer", vocab_size=400, seed=0, num_threads=1)
    pre = tmp_path / "uniter"
    over = tiny_overrides(world, pre, "uniter_tiny")
    over += ["data.batch_size=32", "train.max_steps=600", "train.ckpt_every=600",
             "train.log_every=100"]  # fmt: skip
    pretrain(load_run_config("uniter_tiny", over))
    data = tmp_path / "refexp"
    stats = write_refexp(data, n_train=1500, n_val=8, n_test=100, image_size=32, shard_size=500)
    pretrained = _finetune(data, pre, tmp_path / "pre")
    scratch = _finetune(data, pre, tmp_path / "scratch", "init_mode=architecture")
    print("refexp test accuracy: pre-trained", pretrained, "scratch", scratch)
    assert pretrained["n"] == scratch["n"] == stats["test"]["expressions"]
    # Chance (a region at random) is about 1/3, where both start, on a plateau. Measured: the
    # pre-trained model leaves it first (82.3% at 1500 steps; from scratch 36.9%, though 94%
    # after 2500 steps): the exit is sudden and its step varies, so only the pre-trained
    # model's accuracy is held to a bound (docs/tasks.md).
    assert pretrained["accuracy"] > 60.0


def test_refexp_and_nlvr2_runs_and_their_eval_commands(tmp_path, capsys):
    """A few steps of each recipe from a 2-step UNITER; ``mmptm eval refexp|nlvr2`` count
    every test sample (the accuracies are measured in the slow test and docs/tasks.md)."""
    import json

    from mmptm.cli import main
    from mmptm.toyworld.nlvr2 import write_nlvr2

    world = tmp_path / "world"
    views = ["image_text", "regions"]
    toyworld.generate(world, n_train=40, n_val=4, n_test=4, seed=0, image_size=32,
                      shard_size=50, languages=("en",), views=views)  # fmt: skip
    train_tokenizer([world / "image_text" / "train-000000.tar"], world / "tokenizer",
                    vocab_size=100, seed=0, num_threads=1)  # fmt: skip
    pre = tmp_path / "uniter"
    over = [*tiny_overrides(world, pre, "uniter_tiny"), "train.max_steps=2", "train.ckpt_every=2"]
    pretrain(load_run_config("uniter_tiny", over))
    refexp = write_refexp(tmp_path / "rx", n_train=8, n_val=2, n_test=3, image_size=32)
    nlvr2 = write_nlvr2(tmp_path / "nl", n_train=8, n_val=2, n_test=5, image_size=32)
    for recipe, data, n in (("refcoco", "rx", refexp["test"]["expressions"]),
                            ("nlvr2", "nl", nlvr2["test"]["pairs"])):  # fmt: skip
        run = tmp_path / recipe
        pretrain(load_run_config(recipe, [
            f"init={pre}", f"output_dir={run}", f"data.train={tmp_path}/{data}/train-*.tar",
            f"data.test={tmp_path}/{data}/test-*.tar", "data.batch_size=4",
            "data.num_workers=0", "train.max_steps=2", "train.warmup_steps=1",
            "train.ckpt_every=2", "train.progress=false", f"data.val={tmp_path}/{data}/val-*.tar",
        ]))  # fmt: skip
        capsys.readouterr()
        task = "refexp" if recipe == "refcoco" else "nlvr2"
        assert main(["eval", task, str(run)]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["n"] == n and 0.0 <= result["accuracy"] <= 100.0
