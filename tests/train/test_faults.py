"""The fault suite: what users do to runs — kill them, break their files, fill the disk,
feed them broken data or NaN losses — and what they get: an exact resume or one clear line
(exit status 2). Distributed faults (uneven shards, a stalled rank) are in
``test_distributed.py``."""

from __future__ import annotations

import contextlib
import errno
import io
import itertools
import json
import logging
import os
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, TEXT_MLM, cli_error, text_mlm_overrides, tiny_overrides
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mmptm.cli import build_parser, main
from mmptm.config import load_yaml_tree
from mmptm.data.pipeline import Loader, stream_config
from mmptm.data.shards import ShardWriter
from mmptm.modalities import Need
from mmptm.modalities.audio_io import encode_audio
from mmptm.models import checkpoint
from mmptm.models.pretrain import PretrainModel, PretrainOutput
from mmptm.recipe import DataConfig, load_run_config

CLIP = "clip_tiny"


def test_full_disk_is_one_line_and_keeps_the_last_checkpoint(
    tiny_world, tmp_path, capsys, monkeypatch
):
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("step") == 6:
            f.write(b"the first bytes")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    run = tmp_path / "run"
    line = cli_error(capsys, ["pretrain", TEXT_MLM, *text_mlm_overrides(tiny_world, run)])
    assert "No space left on device" in line and "step_00000003.pt is kept" in line
    assert os.listdir(run / "checkpoints") == ["step_00000003.pt"]  # no temporary file
    assert checkpoint.read(run).step == 3


def _rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_nan_loss_is_skipped_up_to_the_limit_then_stops(
    tiny_world, tmp_path, capsys, monkeypatch, caplog
):
    calls = itertools.count(1)
    real_forward = PretrainModel.forward

    def poisoned(self, batch):  # forward calls 2 and 4 (steps 2 and 3) give NaN
        out = real_forward(self, batch)
        if next(calls) not in (2, 4):
            return out
        terms = {**out.terms, "contrastive_loss": out.terms["contrastive_loss"] * float("nan")}
        return PretrainOutput(out.loss * float("nan"), terms)

    monkeypatch.setattr(PretrainModel, "forward", poisoned)
    run = tmp_path / "run"
    argv = ["pretrain", CLIP, *tiny_overrides(tiny_world, run), "train.max_nonfinite_steps=1"]
    with caplog.at_level(logging.WARNING):
        line = cli_error(capsys, argv)
    keys = r"\(batch keys: train\d+, train\d+"
    assert re.search(r"non-finite loss at step 2: contrastive_loss=nan " + keys, caplog.text)
    assert "step skipped, no update (1 of train.max_nonfinite_steps=1)" in caplog.text
    assert re.search(r"non-finite loss at step 3: contrastive_loss=nan " + keys, line)
    assert [r["step"] for r in _rows(run)] == [1, 2]  # the skipped batch left no row
    assert _rows(run)[-1]["nonfinite_skipped"] == 1


#: runs ``mmptm ARGV`` and kills itself with SIGKILL at a chosen point: ``step5`` as step 5
#: begins (steps 4 and 5 are past the checkpoint of step 3), ``write6`` half way through
#: writing the checkpoint of step 6
KILLER = """
import os, signal, sys
import torch
from mmptm.cli import main
from mmptm.train.trainer import Trainer

where, argv = sys.argv[1], sys.argv[2:]
real_step, real_save = Trainer.train_step, torch.save

def train_step(self, batches):
    if where == "step5" and self.step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_step(self, batches)

def save(obj, f, *args, **kwargs):
    if where == "write6" and isinstance(obj, dict) and obj.get("step") == 6:
        f.write(b"PK half a checkpoint")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *args, **kwargs)

Trainer.train_step, torch.save = train_step, save
sys.exit(main(argv))
"""


def _losses(run) -> dict[int, dict[str, float]]:
    return {r["step"]: {k: v for k, v in r.items() if k.endswith("loss")} for r in _rows(run)}


@pytest.fixture(scope="module")
def uninterrupted(tiny_world, tmp_path_factory):
    run = tmp_path_factory.mktemp("faults") / "full"
    assert main(["pretrain", TEXT_MLM, *text_mlm_overrides(tiny_world, run)]) == 0
    return run


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "parallel"), [("step5", "ddp"), ("write6", "ddp"), ("write6", "fsdp")]
)
def test_kill_9_then_resume_reaches_the_uninterrupted_losses(
    tiny_world, tmp_path, uninterrupted, where, parallel
):
    # fsdp: one process holds the whole model (the same steps) but writes sharded checkpoints,
    # killed after DCP wrote the shards, as rank 0 writes meta.pt before the rename
    run = tmp_path / "run"
    argv = [
        "pretrain",
        TEXT_MLM,
        *text_mlm_overrides(tiny_world, run),
        f"train.parallel={parallel}",
    ]
    killed = subprocess.run([sys.executable, "-c", KILLER, where, *argv], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    logged = {"step5": [1, 2, 3, 4], "write6": [1, 2, 3, 4, 5, 6]}[where]
    assert [r["step"] for r in _rows(run)] == logged
    if where == "write6":  # the killed write left its temporary file, not a step_6 file
        names = os.listdir(run / "checkpoints")
        assert not [n for n in names if n.startswith("step_00000006")]
        assert any(n.startswith(".step_00000006") and n.endswith(".tmp") for n in names)
    assert main([*argv, "resume=true"]) == 0  # from step 3
    assert [r["step"] for r in _rows(run)] == [1, 2, 3, 4, 5, 6]  # each step once
    board = EventAccumulator(str(run))  # TensorBoard too (it hides the killed run's 4..)
    board.Reload()
    assert [e.step for e in board.Scalars("loss/loss")] == [1, 2, 3, 4, 5, 6]
    assert _losses(run) == _losses(uninterrupted)
    a, b = checkpoint.read(run).model, checkpoint.read(uninterrupted).model
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    assert not [p for p in run.rglob("*.tmp")]


@pytest.mark.parametrize(
    ("damage", "parallel"), [("truncated", "ddp"), ("garbage", "ddp"), ("garbage", "fsdp")]
)
def test_broken_newest_checkpoint_resumes_from_the_one_before(
    tiny_world, tmp_path, uninterrupted, caplog, damage, parallel
):
    run = tmp_path / "run"
    argv = [
        "pretrain",
        TEXT_MLM,
        *text_mlm_overrides(tiny_world, run),
        f"train.parallel={parallel}",
    ]
    assert main(argv) == 0
    kind = "dcp" if parallel == "fsdp" else "pt"
    newest = run / "checkpoints" / f"step_00000006.{kind}"
    if parallel == "fsdp":  # shard data of the right size: found only when loaded
        newest = next(newest.glob("*.distcp"))
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 3] if damage == "truncated" else os.urandom(len(data)))
    with caplog.at_level(logging.WARNING):
        assert main([*argv, "resume=true"]) == 0
    assert re.search(
        rf"step_00000006.{kind}: cannot read this checkpoint .*step_00000003.{kind}", caplog.text
    )
    assert _losses(run) == _losses(uninterrupted)
    assert checkpoint.read(run).step == 6  # written again, whole


# ---------------------------------------------------------------------------------------------
# Small faults a user hits (issue 33): each one clear line, or a bad sample skipped and counted

RECIPES = ROOT / "mmptm" / "recipes"
VIDEO_CLIP = str(RECIPES / "pretrain" / "video_clip_tiny.yaml")


def test_a_recipe_that_is_not_utf8_is_one_line_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("seed: 0\n# café au lait\n".encode("latin-1"))
    line = cli_error(capsys, ["pretrain", str(bad)])
    assert line.endswith(
        f"{bad}:2: not UTF-8 text (byte 0xe9 at offset 13); save the file as UTF-8"
    )
    child = tmp_path / "child.yaml"  # a base that is not UTF-8 is named, not the recipe
    child.write_text("base: latin1.yaml\n")
    assert f"{bad}:2: not UTF-8 text" in cli_error(capsys, ["pretrain", str(child)])


def _comment_commands(path: Path) -> list[str]:
    """The ``mmptm ...`` commands a recipe's comments quote: in backticks (across lines) or
    on an indented example line (``#   what it does: mmptm ...``)."""
    lines = [
        m[1] for line in path.read_text().splitlines() if (m := re.search(r"(?:^|\s)#(.*)", line))
    ]
    quoted = re.findall(r"`(mmptm [^`]*)`", " ".join(text.strip() for text in lines))
    shown = [m[1] for text in lines if (m := re.match(r"\s{2,}(?:[^`]*?: )?(mmptm \S.*)", text))]
    return quoted + shown


def _parse_error(argv: list[str]) -> str | None:
    """``mmptm argv``'s parse error (its last line), None when it parses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(argv)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    return None


def test_every_command_quoted_in_a_recipe_comment_parses():
    # A comment may name a command and the flags that matter and leave the rest (a required
    # --out, a flag's value) to the reader; an unknown command, flag or choice is a wrong
    # comment. "data audiocaps|clotho" names two commands.
    commands = {f"{p.relative_to(RECIPES)}: {c}": c for p in sorted(RECIPES.rglob("*.yaml"))
                for c in _comment_commands(p)}  # fmt: skip
    assert len(commands) > 20
    assert any("mmptm tokenizer train" in c for c in commands)
    wrong = {}
    for where, command in commands.items():
        words = [w.split("|") for w in shlex.split(command)[1:]]
        for argv in itertools.product(*words):
            error = _parse_error(list(argv))
            if error and not re.search(r"arguments are required|expected one argument", error):
                wrong[where] = error
    assert wrong == {}


def test_the_tokenizer_command_of_the_tiny_recipes_trains_one(tiny_world, tmp_path, capsys):
    (command,) = [c for c in _comment_commands(RECIPES / "pretrain" / "_toyworld.yaml")
                  if c.startswith("mmptm tokenizer train")]  # fmt: skip
    argv = shlex.split(command.replace("data/toyworld", str(tiny_world)))[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "tokenizer")
    assert main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "tokenizer.model").is_file()


def _wav(seconds: float, cut_after: int | None = None) -> bytes:
    """A 16 kHz tone as 16-bit WAV bytes; ``cut_after``: only that many frames of its data
    remain, behind a header that still promises all of them (a download that stopped)."""
    t = np.arange(round(seconds * 16000)) / 16000
    data = encode_audio((0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000, "wav")
    return data if cut_after is None else data[: 44 + 2 * cut_after]


def _audio_corpus(kind: str, root: Path) -> tuple[list[str], Path]:
    """A tiny corpus of ``kind`` holding good.wav and cut.wav: (mmptm data argv, cut.wav)."""
    audio = root / "audio"
    audio.mkdir(parents=True)
    (audio / "good.wav").write_bytes(_wav(0.25))
    (audio / "cut.wav").write_bytes(_wav(0.25, cut_after=8))
    if kind == "clotho":
        csv = root / "clotho_captions_development.csv"
        head = "file_name,caption_1,caption_2,caption_3,caption_4,caption_5\n"
        csv.write_text(head + "good.wav,a,b,c,d,e\ncut.wav,a,b,c,d,e\n")
        source = ["--csv", str(csv), "--audio-dir", str(audio)]
    elif kind == "audiocaps":
        csv = root / "train.csv"
        csv.write_text("audiocap_id,youtube_id,start_time,caption\n1,good,0,a\n2,cut,0,b\n")
        source = ["--csv", str(csv), "--audio-dir", str(audio)]
    else:
        (root / "meta").mkdir()
        (root / "meta" / "esc50.csv").write_text(
            "filename,fold,target,category,esc10,src_file,take\n"
            "good.wav,1,0,dog,True,1,A\ncut.wav,1,0,dog,True,2,A\n"
        )
        source = ["--root", str(root)]
    argv = ["data", kind, *source, "--out", str(root / "out"), "--no-progress"]
    return argv, audio / "cut.wav"


@pytest.mark.parametrize("kind", ["clotho", "audiocaps", "esc50"])
def test_a_truncated_wav_is_a_skipped_and_counted_clip_in_every_audio_converter(
    kind, tmp_path, capsys, caplog
):
    argv, cut = _audio_corpus(kind, tmp_path)
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0
    summary = capsys.readouterr().out.splitlines()[0]
    assert "wrote 1 clips" in summary and "skipped 1 (unreadable_audio 1)" in summary
    assert f"{cut}: truncated wav: its header promises 4000 frames, the file holds 8" in caplog.text


@pytest.mark.parametrize("window", [0.0, 0.2])  # whole clips; windows chosen from the header
def test_a_truncated_wav_in_a_shard_is_a_skipped_and_counted_sample(tmp_path, caplog, window):
    with ShardWriter(str(tmp_path / "a-%06d.tar"), 10) as w:
        for key in ("k0", "k1", "k2"):
            wav = _wav(1.0, cut_after=8000 if key == "k1" else None)  # k1: 0.5 s of 1 s
            w.write({"__key__": key, "wav": wav, "txt": "x"})
    needs = {"audio": Need("audio", {"features": "fbank", "n_mels": 40})}
    audio = {"type": "audio", "max_seconds": window}
    cfg = DataConfig(train=w.shards[0], batch_size=2, modalities={"audio": audio})
    sc = replace(stream_config(cfg, None, needs=needs), shuffle=False, drop_last=False)
    loader = Loader(sc, num_workers=0)
    with caplog.at_level(logging.WARNING):
        keys = [k for b in loader._epoch_batches() for k in b["__key__"]]
    assert keys == ["k0", "k2"] and loader.skipped == 1
    assert re.search(
        r"sample 'k1' in .*a-000000.tar: ValueError: wav: truncated wav: its header promises "
        r"16000 frames, the file holds 8000",
        caplog.text,
    )


def _recipes_with_sources() -> list[Path]:
    recipes = [p for p in sorted(RECIPES.rglob("*.yaml")) if not p.name.startswith("_")]
    return [p for p in recipes if load_yaml_tree(p).get("data", {}).get("sources")]


@pytest.mark.parametrize("recipe", _recipes_with_sources(), ids=lambda p: p.stem)
def test_own_shards_are_one_data_train_override_away_in_every_recipe(recipe, caplog):
    with caplog.at_level(logging.INFO, logger="mmptm.recipe"):
        cfg = load_run_config(str(recipe), ["data.train=own/train-{000..009}.tar"])
    assert cfg.data.train == "own/train-{000..009}.tar"
    assert cfg.data.sources == {} and cfg.model.routes == {}
    assert "replaces the recipe's data.sources" in caplog.text


def test_sources_and_train_both_set_by_the_user_stay_an_error(tiny_world, tmp_path, capsys):
    over = [*tiny_overrides(tiny_world, tmp_path, "video_clip_tiny"), "data.train=own-*.tar"]
    assert any(o.startswith("data.sources.video.shards=") for o in over)
    cfg = load_run_config(VIDEO_CLIP, over)  # kept as given: the user asked for both
    assert cfg.data.train and set(cfg.data.sources) == {"video", "images"}
    line = cli_error(capsys, ["pretrain", VIDEO_CLIP, *over])
    assert "set data.train or data.sources (video, images), not both" in line


def test_video_clip_tiny_trains_on_own_video_shards_given_as_data_train(tiny_world, tmp_path):
    run = tmp_path / "run"
    over = [o for o in tiny_overrides(tiny_world, run, "video_clip_tiny")
            if not o.startswith("data.sources")]  # fmt: skip
    video = f"{tiny_world}/video/train-*.tar"
    assert main(["pretrain", VIDEO_CLIP, *over, f"data.train={video}",
                 "train.max_steps=2", "train.ckpt_every=2"]) == 0  # fmt: skip
    assert [r["step"] for r in _rows(run)] == [1, 2]
