"""The video_qa recipe: a single-stream video + question model that starts from a
pre-trained dual video_clip run (``init_mode: encoders``) or from scratch."""

from __future__ import annotations

import pytest
import torch
from conftest import synthetic_batch, tiny_overrides

from mmptm.config import to_dict
from mmptm.encoders.base import VocabInfo
from mmptm.models import checkpoint
from mmptm.models.load import build_model, init_from, load_init
from mmptm.recipe import load_run_config

QA = "video_qa"
SMALL = [
    "model.width=32",
    "model.fusion.transformer.heads=2",
    "model.fusion.transformer.layers=1",
    "model.objectives.vqa.answers=__delete__",
    "model.objectives.vqa.num_answers=5",
    "model.encoders.video.backbone.image_size=32",  # as tiny_overrides gives the pre-training run
]


def _pretrained_clip(tiny_world, tmp_path):
    """A video_clip_tiny run directory (random weights) with a checkpoint, as training writes."""
    run = tmp_path / "clip"
    over = [
        *tiny_overrides(tiny_world, run, "video_clip_tiny"),
        "model.fusion.transformer.layers=2",
    ]
    cfg = load_run_config("video_clip_tiny", over)
    torch.manual_seed(1)
    model, _ = build_model(cfg)
    checkpoint.write(run / checkpoint.CKPT_DIR, 1, model=model.state_dict(), config=to_dict(cfg))
    return run, model


def test_video_qa_starts_from_a_dual_video_clip_run(tiny_world, tmp_path):
    run, clip = _pretrained_clip(tiny_world, tmp_path)
    over = [f"init={run}", f"data.tokenizer={tiny_world}/tokenizer.model", *SMALL]
    cfg = load_run_config(QA, over)
    ckpt = init_from(cfg)
    assert cfg.model.fusion.type == "single_stream"  # the recipe's model stays
    torch.manual_seed(0)
    qa, tok = build_model(cfg)
    fresh = {k: v.clone() for k, v in qa.state_dict().items()}
    load_init(qa, ckpt.model, str(run), only="encoders.")
    got, src = qa.state_dict(), clip.state_dict()
    enc = [k for k in got if k.startswith("encoders.")]
    tower = [k for k in got if k.startswith("fusion.towers.text.")]
    assert enc and tower
    for k in enc + tower:  # the encoders, and the dual text tower as the unimodal tower
        assert torch.equal(got[k], src[k]), k
    for k in got:
        if k.startswith(("fusion.stack.", "objectives.")):
            assert torch.equal(got[k], fresh[k]), k  # joint layers and the head start fresh
    batch = synthetic_batch(qa, VocabInfo.from_tokenizer(tok))
    batch["vqa_targets"] = torch.rand(len(batch["__key__"]), 5)
    out = qa(batch)
    assert torch.isfinite(out.loss) and "vqa_score" in out.terms


def test_encoders_must_fit_and_scratch_needs_no_run(tiny_world, tmp_path):
    run, _ = _pretrained_clip(tiny_world, tmp_path)
    tok = f"data.tokenizer={tiny_world}/tokenizer.model"
    cfg = load_run_config(
        QA, [f"init={run}", tok, *SMALL, "model.encoders.video.temporal_layers=3"]
    )
    ckpt = init_from(cfg)
    qa, _ = build_model(cfg)
    with pytest.raises(
        ValueError, match=r"lacks 16 tensors: \[.encoders.video.temporal.stack.blocks.2"
    ):
        load_init(qa, ckpt.model, str(run), only="encoders.")
    scratch = load_run_config(QA, ["init=__delete__", tok, *SMALL])
    assert scratch.init == "" and init_from(scratch) is None
    build_model(scratch)
