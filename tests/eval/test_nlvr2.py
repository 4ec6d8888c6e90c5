"""NLVR2's consistency (its official metrics.py: sentence groups with the pair id blanked),
by hand."""

from __future__ import annotations

import pytest

from mmptm.data.shards import ShardWriter
from mmptm.eval.nlvr2 import consistency, identifiers, sentence_group


def test_sentence_group_blanks_the_pair_id():
    assert sentence_group("dev-850-0-0") == "dev-850--0"
    assert sentence_group("dev-850-3-0") == "dev-850--0"
    assert sentence_group("dev-850-3-1") == "dev-850--1"
    assert sentence_group("test-5") is None  # toyworld's: no sentence groups


def test_consistency_counts_sentences_whose_every_pair_is_right():
    judged = [
        ("dev-1-0-0", True), ("dev-1-1-0", True), ("dev-1-2-0", False),  # sentence 1-0: no
        ("dev-1-0-1", True), ("dev-1-3-1", True),  # sentence 1-1: yes
        ("dev-2-0-0", True),  # set 2, sentence 0 (not set 1's): yes
        ("dev-3-0-0", False),  # no
    ]  # fmt: skip
    assert consistency(judged) == pytest.approx(100.0 * 2 / 4)
    assert consistency([("dev-1-0-0", True)]) == 100.0
    assert consistency([]) is None
    assert consistency([("dev-1-0-0", True), ("train-7", True)]) is None


def test_identifiers_read_from_the_json(tmp_path):
    with ShardWriter(tmp_path / "test-%06d.tar", 10) as w:
        w.write({"__key__": "a", "json": {"identifier": "test1-4-1-0"}})
        w.write({"__key__": "b", "json": {"sentence": "no identifier"}})
    assert identifiers(str(tmp_path / "test-000000.tar")) == {"a": "test1-4-1-0", "b": "b"}


def test_eval_nlvr2_reports_consistency_of_nlvr2_identifiers(tmp_path, capsys):
    """A 2-step NLVR2 run scored on one test split under three namings: toyworld's (no
    consistency), one sentence per pair (consistency = accuracy) and one sentence for all
    (100 only if every pair is right)."""
    import json

    from conftest import tiny_overrides

    from mmptm import toyworld
    from mmptm.cli import main
    from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
    from mmptm.recipe import load_run_config
    from mmptm.tokenizers.sentencepiece import train_tokenizer
    from mmptm.toyworld.nlvr2 import write_nlvr2
    from mmptm.train.trainer import pretrain

    world = tmp_path / "world"
    views = ["image_text", "regions"]
    toyworld.generate(world, n_train=40, n_val=4, n_test=4, seed=0, image_size=32,
                      shard_size=50, languages=("en",), views=views)  # fmt: skip
    train_tokenizer([world / "image_text" / "train-000000.tar"], world / "tokenizer",
                    vocab_size=100, seed=0, num_threads=1)  # fmt: skip
    pre = tmp_path / "uniter"
    over = [*tiny_overrides(world, pre, "uniter_tiny"), "train.max_steps=2", "train.ckpt_every=2"]
    pretrain(load_run_config("uniter_tiny", over))
    data = tmp_path / "nl"
    write_nlvr2(data, n_train=8, n_val=2, n_test=6, image_size=32)
    run = tmp_path / "nlvr2"
    pretrain(load_run_config("nlvr2", [
        f"init={pre}", f"output_dir={run}", f"data.train={data}/train-*.tar",
        f"data.val={data}/val-*.tar", f"data.test={data}/test-*.tar", "data.batch_size=4",
        "data.num_workers=0", "train.max_steps=2", "train.warmup_steps=1", "train.ckpt_every=2",
        "train.progress=false"]))  # fmt: skip
    samples = list(tar_samples(expand_shards(f"{data}/test-*.tar"), SkipCounter()))
    for name, ident in (("each", lambda i: f"test1-{i}-0-0"), ("one", lambda i: f"test1-0-{i}-0")):
        with ShardWriter(tmp_path / f"{name}-%06d.tar", 100) as w:
            for i, s in enumerate(samples):
                meta = {**json.loads(s["json"]), "identifier": ident(i)}
                w.write({**{k: v for k, v in s.items() if not k.startswith("__")},
                         "__key__": s["__key__"], "json": meta})  # fmt: skip
    capsys.readouterr()
    assert main(["eval", "nlvr2", str(run), "--set", f"toy={data}/test-*.tar",
                 "--set", f"each={tmp_path}/each-*.tar",
                 "--set", f"one={tmp_path}/one-*.tar"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    acc = result["toy"]["accuracy"]
    assert "consistency" not in result["toy"] and result["toy"]["n"] == 6
    assert result["each"] == {"accuracy": acc, "n": 6.0, "consistency": acc, "groups": 6.0}
    assert result["one"]["groups"] == 1.0
    assert result["one"]["consistency"] == (100.0 if acc == 100.0 else 0.0)
