"""End to end through the command line: toyworld → tokenizer → pretrain → eval retrieval, DDP."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, cli_error, tiny_overrides

from mmptm.cli import main
from mmptm.config import load_yaml_tree
from mmptm.search.index import SearchIndex
from mmptm.studies import DEMO_QUERIES, LANGS

PY = sys.executable


def mmptm(*args: str, timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [PY, "-m", "mmptm.cli", *args],
        capture_output=True, text=True, timeout=timeout, cwd=kw.get("cwd", ROOT), env=env,
    )  # fmt: skip


@pytest.mark.slow
def test_toyworld_tokenizer_pretrain_eval_end_to_end(tmp_path):
    world = tmp_path / "tw"
    r = mmptm("data", "toyworld", "--out", str(world), "--n-train", "64", "--n-val", "16",
              "--n-test", "16", "--image-size", "32", "--shard-size", "16")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads((world / "manifest.json").read_text())["counts"]["test"] == 16
    r = mmptm("tokenizer", "train", "--input", str(world / "image_text"), "--out",
              str(world / "tokenizer"), "--vocab-size", "300")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = tmp_path / "run"
    r = mmptm("pretrain", "configs/pretrain/clip_tiny.yaml", *tiny_overrides(world, run))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["step"] == 6
    r = mmptm("eval", "retrieval", str(run), "--split", "test", "--out", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    assert "i2t_R@1" in r.stdout and "t2i_R@10" in r.stdout
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["n"] == 16 and result["chance_R@1"] == pytest.approx(1 / 16)
    for k in (1, 5, 10):
        assert 0.0 <= result[f"i2t_R@{k}"] <= result.get(f"i2t_R@{k * 2}", 1.0) <= 1.0


def test_bad_config_key_is_one_clear_line(tmp_path):
    r = mmptm("pretrain", "configs/pretrain/clip_tiny.yaml", "train.max_step=3",
              f"output_dir={tmp_path}/x")  # fmt: skip
    assert r.returncode == 2
    assert "train.max_step" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()


def test_missing_config_file_is_named(tmp_path):
    r = mmptm("pretrain", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "nope.yaml" in r.stderr


def test_unwritable_output_dir_is_one_line_before_training(tiny_world, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    over = [*tiny_overrides(tiny_world, blocker / "run")]
    line = cli_error(capsys, ["pretrain", "configs/pretrain/clip_tiny.yaml", *over])
    assert f"output_dir {blocker / 'run'} is not writable" in line
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        over = [*tiny_overrides(tiny_world, locked / "run")]
        line = cli_error(capsys, ["pretrain", "configs/pretrain/clip_tiny.yaml", *over])
        assert "is not writable" in line and "Permission denied" in line


def test_shards_none_of_which_is_readable_are_one_line(tiny_world, tmp_path, capsys):
    for i in range(2):
        (tmp_path / f"bad-{i}.tar").write_bytes(os.urandom(3000))
    over = [*tiny_overrides(tiny_world, tmp_path / "run"), f"data.train={tmp_path}/bad-*.tar"]
    line = cli_error(capsys, ["pretrain", "configs/pretrain/clip_tiny.yaml", *over])
    assert "no batch" in line and "2 bad samples were skipped" in line
    with pytest.raises(ValueError, match="no batch"):  # --debug: the traceback
        main(["--debug", "pretrain", "configs/pretrain/clip_tiny.yaml", *over])


def test_the_readme_session_stops_and_resumes(tiny_world, tmp_path, capsys, caplog):
    """README, Command line: a run started with overrides continues with the same command
    and resume=true; leaving one out that changes the schedule is refused with what to type."""
    run = tmp_path / "clip"
    base = [*tiny_overrides(tiny_world, run)]  # (they set train.max_steps=6)
    first = ["pretrain", "configs/pretrain/clip_tiny.yaml", *base, "train.max_steps=4"]
    assert main([*first, "train.stop_at=2"]) == 0  # interrupted at step 2
    line = cli_error(capsys, ["pretrain", "configs/pretrain/clip_tiny.yaml", *base, "resume=true"])
    assert "train.max_steps=4" in line and "repeat the overrides" in line
    assert main([*first, "train.lr=1e-4", "resume=true"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 4
    assert "train.lr: 0.001 -> 0.0001" in caplog.text  # other changes are named


@pytest.mark.slow
def test_two_process_ddp_on_cpu(tiny_world, tmp_path):
    run = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run(
        [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "mmptm.cli", "pretrain", "configs/pretrain/clip_tiny.yaml",
         *tiny_overrides(tiny_world, run), "train.max_steps=4", "train.ckpt_every=2"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    state = torch.load(run / "checkpoints" / "step_00000004.pt", weights_only=False)
    assert state["world_size"] == 2
    assert [s["rank"] for s in state["ranks"]] == [0, 1]
    # Each rank read 4 batches of 8 from its own half of the shards (96 samples, 6 shards).
    assert [sum(s["data"]["consumed"]) for s in state["ranks"]] == [4, 4]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # only rank 0 writes
    # Both ranks print their last metrics: different data, so different losses; DDP-averaged
    # gradients, so the same gradient norm.
    # (the two processes share one stdout pipe, so their lines may interleave: decode each
    # object where it starts)
    decoder = json.JSONDecoder()
    starts = [m.start() for m in re.finditer(r'\{"step": 4,', r.stdout)]
    last = [decoder.raw_decode(r.stdout, i)[0] for i in starts]
    assert len(last) == 2
    assert last[0]["loss"] != last[1]["loss"]
    assert last[0]["grad_norm"] == pytest.approx(last[1]["grad_norm"], rel=1e-5)


@pytest.mark.slow
def test_demo_video_runs_every_recipe_and_video_qa(tmp_path, capsys):
    """`mmptm demo video` end to end at toy sizes: data, codebook, three pre-trainings (and
    the bag of frames), retrieval per language, the reversal test, video QA both ways."""
    out = tmp_path / "demo"
    argv = ["demo", "video", "--out", str(out), "--n-train", "32", "--n-test", "16",
            "--steps", "3", "--qa-steps", "2",
            "--recipes", "videoclip_tiny,video_clip_tiny,videobert_tiny,cbt_tiny",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    runs = {"videoclip_tiny", "bag of frames", "video_clip_tiny", "videobert_tiny", "cbt_tiny"}
    assert set(result["retrieval"]) == set(result["reversal"]) == runs
    assert set(result["languages"]) == {"en", "de", "fr", "ru", "es"}
    assert all(0 <= r["reversal_acc"] <= 1 and r["n"] == 16 for r in result["reversal"].values())
    assert set(result["video_qa"]) == {
        f"{run} {how}" for run in ("videoclip_tiny", "video_clip_tiny", "cbt_tiny")
        for how in ("pre-trained", "from scratch")
    }  # fmt: skip
    printed = capsys.readouterr().out
    assert "reversal test" in printed and "text↔video retrieval" in printed
    assert _drawn(out / "curves.png") and _drawn(out / "curves_qa.png")


@pytest.mark.slow
def test_demo_audio_runs_every_recipe(tmp_path, capsys):
    """`mmptm demo audio` end to end at toy sizes: scene sounds and spoken captions, the MFCC
    codebook, five pre-trainings, retrieval (text↔audio per language, sound↔image, spoken
    caption↔image both ways), linear probes against their random-init baselines."""
    out = tmp_path / "demo"
    argv = ["demo", "audio", "--out", str(out), "--n-train", "32", "--n-test", "16",
            "--steps", "2", "--ft-steps", "2",
            "--recipes", "clap_tiny,audio_image_tiny,wav2vec2_tiny,hubert_tiny,speechbert_tiny",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert set(result["retrieval"]) == {
        "text↔audio (CLAP)", "image↔sound",
        "spoken caption↔image, pre-trained", "spoken caption↔image, from scratch",
    }  # fmt: skip
    assert set(result["languages"]) == {"en", "de", "fr", "ru"}
    assert set(result["probe"]) == {
        f"{r} {how}" for r in ("clap_tiny", "wav2vec2_tiny", "hubert_tiny")
        for how in ("pre-trained", "random init")
    }  # fmt: skip
    for r in result["probe"].values():
        assert 0 <= r["acc"] <= 1 and r["n_test"] == 16
    printed = capsys.readouterr().out
    assert "linear probe" in printed and "text↔audio" in printed
    assert _drawn(out / "curves.png") and _drawn(out / "curves_speech_image.png")


def _drawn(png) -> bool:
    """A figure with coloured lines on it (axes and text are black and grey)."""
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(png).convert("RGB")).astype(int)
    return int((rgb.max(-1) - rgb.min(-1) > 60).sum()) > 200


def test_demo_clip_writes_results_and_curves(tmp_path, capsys):
    """`mmptm demo` (the README's `make demo`) at toy sizes: retrieval table, curves."""
    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--n-train", "32", "--n-test", "16", "--steps", "4",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0",
            "--set", "train.log_every=2"]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["retrieval"]["n"] == 16
    by_lang = results["retrieval_by_language"]
    assert set(by_lang) == {"en", "de", "fr", "ru"} and by_lang["en"] == results["retrieval"]
    # each language's captions are their own test: the table differs from English somewhere
    assert any(r != by_lang["en"] for r in by_lang.values())
    rows = [json.loads(line) for line in (out / "clip_tiny" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [2, 4]
    assert _drawn(out / "curves.png")
    printed = capsys.readouterr().out
    assert f"training curves: {out / 'curves.png'}" in printed
    # the test images are indexed by the demo's run and searched in three languages
    index = SearchIndex.open(out / "index")
    assert index.meta["counts"]["items"] == 16
    assert Path(index.meta["checkpoint"]).parent.parent == (out / "clip_tiny").resolve()
    assert {lang for _, lang in DEMO_QUERIES} >= {"en", "ru"}
    for query, lang in DEMO_QUERIES:
        assert f"{query!r} → images (their {lang} captions)" in printed
        hits = index.search_text(query, k=3, lang=lang)
        block = printed.split(f"{query!r} → images")[1].split("\n\n")[0]
        assert [line.split()[2] for line in block.splitlines()[2:5]] == [h.key for h in hits]
        assert all(h.language == lang and h.caption in block for h in hits)
    assert f"mmptm serve {out / 'index'}" in printed


def test_toyworld_writes_the_five_languages_the_recipes_and_readme_name(tmp_path, capsys):
    """The multilingual recipes read mono shards of en, de, fr, ru and es (as the README
    says); the command's default left out es, so mbert_tiny found no es shards."""
    out = tmp_path / "tw"
    assert main(["data", "toyworld", "--out", str(out), "--n-train", "5", "--n-val", "0",
                 "--n-test", "0", "--image-size", "16"]) == 0  # fmt: skip
    languages = json.loads((out / "manifest.json").read_text())["languages"]
    recipe = load_yaml_tree(ROOT / "configs/pretrain/_toyworld_text.yaml")
    assert languages == recipe["data"]["sources"]["mono"]["languages"] == list(LANGS)
