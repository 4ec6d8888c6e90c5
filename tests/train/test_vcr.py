"""VCR's multiple choice end to end on a small toyworld: a few fine-tuning steps from a
single-stream (UNITER) and a two-stream (LXMERT) run, then ``mmptm eval vcr``."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_overrides

from mmptm import toyworld
from mmptm.cli import main
from mmptm.recipe import load_run_config
from mmptm.tokenizers.sentencepiece import train_tokenizer
from mmptm.toyworld.vcr import write_vcr
from mmptm.train.trainer import pretrain


def _finetune(data, init, out, *extra: str) -> None:
    pretrain(load_run_config("vcr", [
        f"init={init}", f"output_dir={out}", f"data.train={data}/train-*.tar",
        f"data.val={data}/val-*.tar", f"data.test={data}/test-*.tar", "data.batch_size=4",
        "data.num_workers=0", "train.warmup_steps=1", "train.progress=false", *extra,
    ]))  # fmt: skip


@pytest.mark.parametrize("recipe", ["uniter_tiny", "lxmert_tiny"])
def test_vcr_runs_and_its_eval_command(tmp_path, capsys, recipe):
    """A few steps of the recipe from a 2-step pre-trained run; ``mmptm eval vcr`` counts
    every test question of both tasks (what the head learns is measured in docs/tasks.md)."""
    world = tmp_path / "world"
    views = ["image_text", "regions"]
    toyworld.generate(world, n_train=40, n_val=4, n_test=4, seed=0, image_size=32,
                      shard_size=50, languages=("en",), views=views)  # fmt: skip
    train_tokenizer([world / "image_text" / "train-000000.tar"], world / "tokenizer",
                    vocab_size=100, seed=0, num_threads=1)  # fmt: skip
    pre = tmp_path / "pre"
    over = [*tiny_overrides(world, pre, recipe), "train.max_steps=2", "train.ckpt_every=2"]
    pretrain(load_run_config(recipe, over))
    stats = write_vcr(tmp_path / "vcr", n_train=8, n_val=2, n_test=6, image_size=32)
    run = tmp_path / "vcr_run"
    _finetune(tmp_path / "vcr", pre, run, "train.max_steps=2", "train.ckpt_every=2")
    capsys.readouterr()
    assert main(["eval", "vcr", str(run)]) == 0
    result = json.loads(capsys.readouterr().out)
    n = stats["test"]["questions"]
    assert result["n_q_a"] == result["n_qa_r"] == result["n_q_ar"] == n > 0
    assert result["n"] == 2 * n
    for key in ("q_a", "qa_r", "q_ar", "accuracy"):
        assert 0.0 <= result[key] <= 100.0
    assert result["q_ar"] <= min(result["q_a"], result["qa_r"])
