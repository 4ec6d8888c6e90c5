"""The training loop: exact resume, outputs on disk, failure reporting, optimiser set-up."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TEXT_MLM, text_mlm_overrides, tiny_overrides

from mmptm.config import ConfigError
from mmptm.models import checkpoint
from mmptm.models.load import build_model
from mmptm.models.pretrain import PretrainModel, PretrainOutput
from mmptm.recipe import TrainConfig, load_run_config
from mmptm.train.optim import lr_factor, param_groups
from mmptm.train.trainer import NonFiniteLoss, Trainer, pretrain

VILT = "vilt_tiny"
CLIP = "clip_tiny"


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _losses(rows: list[dict]) -> dict[int, dict[str, float]]:
    return {r["step"]: {k: v for k, v in r.items() if k.endswith("loss")} for r in rows}


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_reaches_the_same_losses_as_an_uninterrupted_run(tiny_world, tmp_path, workers):
    # vilt_tiny has dropout, ITM negatives and MLM masking: every source of randomness.
    extra = [f"data.num_workers={workers}", "train.max_steps=8", "train.ckpt_every=4"]
    full = tmp_path / "full"
    pretrain(load_run_config(VILT, [*tiny_overrides(tiny_world, full, "vilt_tiny"), *extra]))
    split = tmp_path / "split"
    first = [*tiny_overrides(tiny_world, split, "vilt_tiny"), *extra, "train.stop_at=3"]
    pretrain(load_run_config(VILT, first))
    assert max(_losses(_rows(split))) == 3
    second = [*tiny_overrides(tiny_world, split, "vilt_tiny"), *extra, "resume=true"]
    pretrain(load_run_config(VILT, second))

    reference, resumed = _losses(_rows(full)), _losses(_rows(split))
    assert sorted(resumed) == list(range(1, 9)) == sorted(reference)
    for step in range(1, 9):
        assert resumed[step] == reference[step], f"step {step}"
    a = checkpoint.read(full).model
    b = checkpoint.read(split).model
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_run_writes_config_metrics_and_atomic_checkpoints(tiny_world, tmp_path):
    run = tmp_path / "run"
    last = pretrain(
        load_run_config(CLIP, [*tiny_overrides(tiny_world, run), "train.keep_checkpoints=1"])
    )
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["output_dir"] == str(run) and saved["train"]["max_steps"] == 6
    rows = _rows(run)
    assert [r["step"] for r in rows] == list(range(1, 7))
    for r in rows:
        assert {"loss", "contrastive_loss", "lr", "data_skipped"} <= set(r)
        assert math.isfinite(r["loss"])
    assert last == rows[-1]
    files = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert files == ["step_00000006.pt"]  # pruned to keep_checkpoints; no temp files left
    ck = checkpoint.read(run / "checkpoints" / files[0])
    assert ck.step == 6 and ck.config["model"]["width"] == 32 and len(ck.ranks) == 1
    assert ck.optimizer is not None and ck.scheduler is not None
    # The saved config alone rebuilds the model the weights belong to.
    model, _ = build_model(load_run_config(str(run / "config.yaml")))
    model.load_state_dict(ck.model)


def test_bad_config_key_fails_before_training_naming_the_key(tiny_world, tmp_path):
    base = tiny_overrides(tiny_world, tmp_path / "r")
    with pytest.raises(ConfigError, match=r"train\.max_step\b.*did you mean 'train\.max_steps'"):
        load_run_config(CLIP, [*base, "train.max_step=3"])
    with pytest.raises(ConfigError, match=r"model\.objectives\.contrastive\.embed_dimm"):
        load_run_config(CLIP, [*base, "model.objectives.contrastive.embed_dimm=3"])
    with pytest.raises(ConfigError, match=r"model\.fusion\.type.*choices: dual, .*single_stream"):
        load_run_config(CLIP, [*base, "model.fusion.type=triple"])
    with pytest.raises(ConfigError, match=r"train\.lr"):
        load_run_config(CLIP, [*base, "train.lr=fast"])
    assert not (tmp_path / "r").exists()


def test_non_finite_loss_names_the_step_and_samples(tiny_world, tmp_path, monkeypatch):
    cfg = load_run_config(CLIP, tiny_overrides(tiny_world, tmp_path / "r"))
    real_forward = PretrainModel.forward

    def poisoned(self, batch):
        out = real_forward(self, batch)
        return PretrainOutput(out.loss * float("nan"), out.terms)

    monkeypatch.setattr(PretrainModel, "forward", poisoned)
    trainer = Trainer(cfg)
    with pytest.raises(NonFiniteLoss, match=r"at step 1: loss=nan \(batch keys: train\d+"):
        trainer.fit()


def test_resume_from_other_world_size_is_refused(tiny_world, tmp_path):
    run = tmp_path / "r"
    pretrain(load_run_config(CLIP, [*tiny_overrides(tiny_world, run), "train.max_steps=2"]))
    path = checkpoint.resolve(run)
    state = torch.load(path, weights_only=False)
    state["world_size"] = 2
    checkpoint.save_atomic(state, path)
    trainer = Trainer(load_run_config(CLIP, [*tiny_overrides(tiny_world, run), "resume=true"]))
    with pytest.raises(ValueError, match="written by 2 ranks"):
        trainer.fit()


def test_weight_decay_skips_biases_norms_and_scalars(tiny_world):
    cfg = load_run_config(CLIP, tiny_overrides(tiny_world, Path("unused")))
    model, _ = build_model(cfg)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    decay_names = {names[id(p)] for p in decay["params"]}
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    assert "objectives.contrastive.logit_scale" in no_decay_names
    assert any(n.endswith("norm.weight") for n in no_decay_names)
    assert all(not n.endswith(".bias") for n in decay_names)
    assert "encoders.text.word.weight" in decay_names
    assert len(decay_names) + len(no_decay_names) == len(list(model.parameters()))


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_lr_schedule_warms_up_then_decays(schedule):
    cfg = TrainConfig(max_steps=110, warmup_steps=10, schedule=schedule, min_lr_ratio=0.1)
    f = [lr_factor(s, cfg) for s in range(111)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a < b for a, b in itertools.pairwise(f[:10]))  # warmup rises linearly
    if schedule == "constant":
        assert f[10:] == [1.0] * 101
        return
    assert f[10] == pytest.approx(1.0) and f[110] == pytest.approx(0.1)
    mid = 0.1 + 0.9 * 0.5  # half way both decays are at the midpoint
    assert f[60] == pytest.approx(mid)
    if schedule == "cosine":
        assert f[35] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25)))
    else:
        assert f[35] == pytest.approx(0.1 + 0.9 * 0.75)


def test_freeze_keeps_matching_parameters_and_trains_the_rest(tiny_world, tmp_path):
    run = tmp_path / "r"
    over = [*tiny_overrides(tiny_world, run), "train.max_steps=3", "train.freeze=[encoders.text.*]"]
    cfg = load_run_config(CLIP, over)
    trainer = Trainer(cfg)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.fit()
    after = dict(trainer.model.named_parameters())
    frozen = {n for n in before if n.startswith("encoders.text.")}
    assert "encoders.text.word.weight" in frozen
    for n in frozen:
        assert torch.equal(before[n], after[n].detach()) and not after[n].requires_grad, n
    trained = [n for n in before if n not in frozen]
    changed = [n for n in trained if not torch.equal(before[n], after[n].detach())]
    assert len(changed) > len(trained) // 2, f"only {changed} changed"
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert not any(id(after[n]) in in_optimizer for n in frozen)


def test_freeze_pattern_matching_nothing_is_an_error(tiny_world, tmp_path):
    over = [*tiny_overrides(tiny_world, tmp_path / "r"), "train.freeze=[encoder.txt.*]"]
    with pytest.raises(ValueError, match=r"train.freeze: 'encoder.txt.\*' matches no parameter"):
        Trainer(load_run_config(CLIP, over))


def test_resume_with_another_schedule_is_refused(tiny_world, tmp_path):
    run = tmp_path / "r"
    pretrain(load_run_config(CLIP, [*tiny_overrides(tiny_world, run), "train.max_steps=2"]))
    over = [*tiny_overrides(tiny_world, run), "train.max_steps=3", "resume=true"]
    trainer = Trainer(load_run_config(CLIP, over))
    with pytest.raises(ValueError, match=r"train.max_steps=2, this one has 3: to continue"):
        trainer.fit()
    same = [*tiny_overrides(tiny_world, run), "train.max_steps=2", "resume=true"]
    trainer = Trainer(load_run_config(CLIP, same))
    trainer.fit()  # a finished run resumes to its end: nothing left to do
    assert trainer.step == 2


def test_trainer_clamps_the_logit_scale_after_each_step(tiny_world, tmp_path):
    cfg = load_run_config(CLIP, [*tiny_overrides(tiny_world, tmp_path / "r"), "train.max_steps=1"])
    trainer = Trainer(cfg)
    scale = trainer.model.objectives["contrastive"].logit_scale
    with torch.no_grad():
        scale.fill_(6.0)  # ln 403: above ln 100
    trainer.fit()
    assert scale.item() == pytest.approx(math.log(100.0))


def test_resume_behind_the_last_logged_step_keeps_one_row_per_step(tiny_world, tmp_path):
    run = tmp_path / "r"
    over = text_mlm_overrides(tiny_world, run)  # 6 steps, a checkpoint every 3
    pretrain(load_run_config(TEXT_MLM, over))
    first = _rows(run)
    # killed after logging step 6 but before its checkpoint landed: a temporary file is left
    ckpt6 = run / "checkpoints" / "step_00000006.pt"
    ckpt6.rename(run / "checkpoints" / ".step_00000006.pt.k1ll3d00.tmp")
    pretrain(load_run_config(TEXT_MLM, [*over, "resume=true"]))
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # 4..6 were written twice before
    assert _losses(rows) == _losses(first)
    leftovers = [p.name for p in run.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def test_a_fresh_run_into_an_output_dir_with_checkpoints_is_refused(tiny_world, tmp_path):
    """It would mix two runs: the old, later checkpoints would survive pruning and be the
    ones resume=true picks, and the old rows would stay in metrics.jsonl."""
    run = tmp_path / "r"
    over = [*text_mlm_overrides(tiny_world, run), "train.max_steps=2"]
    pretrain(load_run_config(TEXT_MLM, over))
    with pytest.raises(ValueError, match=r"has checkpoints .*step_00000002.pt.*resume=true"):
        Trainer(load_run_config(TEXT_MLM, over)).fit()
    assert [r["step"] for r in _rows(run)] == [1, 2]


@pytest.mark.parametrize(
    ("recipe", "key", "extra"),
    [("uniter_tiny", "model.task_mix", ""), ("xlm_xlco_tiny", "model.routes", ""),
     ("visualbert_tiny", "model.starts", "model.starts={itm: 0.5}")],
)  # fmt: skip
def test_fsdp_refuses_settings_that_let_ranks_train_different_parameters(
    tiny_world, tmp_path, recipe, key, extra
):
    over = [*tiny_overrides(tiny_world, tmp_path, recipe), "train.parallel=fsdp"]
    over += [extra] if extra else []
    with pytest.raises(ValueError, match=f"same parameters at each step, but {key} "):
        Trainer(load_run_config(recipe, over))
