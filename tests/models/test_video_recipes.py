"""The video recipes build, and each tiny one takes a forward/backward step on a synthetic batch
with the contract's keys (frames, features, units, text) reaching every weight; the bag-of-
frames baseline is the video_clip recipe with one override."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import synthetic_batch, tiny_overrides

from mmptm.encoders.base import VocabInfo
from mmptm.models.load import build_model
from mmptm.recipe import load_run_config

VIDEO_TINY = ["video_clip_tiny", "videobert_tiny", "cbt_tiny"]
K = 24


def _codebook(tmp_path, k: int = K, dim: int = 8) -> str:
    path = tmp_path / "codebook.npy"
    np.save(path, np.random.default_rng(0).standard_normal((k, dim)).astype(np.float32))
    return str(path)


def _config(recipe: str, tiny_world, tmp_path, extra=()):
    over = tiny_overrides(tiny_world, tmp_path, recipe)
    tree_has_units = "videobert" in recipe
    if tree_has_units:
        over.append(f"model.encoders.units.codebook={_codebook(tmp_path)}")
    return load_run_config(recipe, [*over, *extra])


@pytest.mark.parametrize("recipe", VIDEO_TINY)
def test_video_tiny_recipe_steps_on_a_synthetic_batch(recipe, tiny_world, tmp_path):
    cfg = _config(recipe, tiny_world, tmp_path)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    vocab = VocabInfo.from_tokenizer(tok)
    batch = synthetic_batch(model, vocab)
    model.train()
    out = model(batch)
    assert torch.isfinite(out.loss)
    want = {
        "video_clip_tiny": {"contrastive_loss", "contrastive_acc"},
        "videobert_tiny": {"mlm_loss", "masked_units_loss", "masked_units_acc", "itm_loss"},
        "cbt_tiny": {"masked_frames_loss", "masked_frames_acc", "contrastive_loss"},
    }[recipe]
    assert want <= set(out.terms), sorted(out.terms)
    out.loss.backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in trainable if p.grad is None]
    assert not missing, f"no gradient reaches {missing}"
    zero = [n for n, p in trainable if ".backbone." not in n and not p.grad.abs().sum() > 0]
    assert not zero, f"zero gradient at {zero}"


def test_videobert_itm_negatives_swap_units_and_carry_no_labels(tiny_world, tmp_path):
    cfg = _config("videobert_tiny", tiny_world, tmp_path)
    model, tok = build_model(cfg)
    batch = synthetic_batch(model, VocabInfo.from_tokenizer(tok), B=32)
    neg = batch["itm_labels"] == 0
    assert 0 < neg.sum() < 32
    assert bool((batch["unit_labels"][neg] == -100).all())
    assert bool((batch["mlm_labels"][neg] == -100).all())


def test_bag_of_frames_baseline_is_one_override(tiny_world, tmp_path):
    """temporal_layers=0: the pooled clip vector ignores frame order; the recipe's temporal
    layer does not, once its zero-initialised positions have been trained."""
    bag = _config(
        "video_clip_tiny", tiny_world, tmp_path, ["model.encoders.video.temporal_layers=0"]
    )
    temporal = _config("video_clip_tiny", tiny_world, tmp_path)
    assert temporal.model.encoders["video"].temporal_layers == 2
    assert bag.model.fusion.layers == {"video": 0} and bag.model.fusion.pooling["video"] == "mean"
    perm = torch.tensor([4, 2, 0, 3, 1])
    gaps = {}
    for name, cfg in (("bag", bag), ("temporal", temporal)):
        torch.manual_seed(0)
        model, tok = build_model(cfg)
        model.eval()
        with torch.no_grad():
            model.encoders["video"].temporal.pos.normal_(std=0.5)  # as if trained
        batch = synthetic_batch(model, VocabInfo.from_tokenizer(tok))
        full = batch["frames_mask"].all(1)
        with torch.no_grad():
            a = model.fuse(batch).pooled["video"][full]
            batch["frames"] = batch["frames"][:, perm]
            b = model.fuse(batch).pooled["video"][full]
        gaps[name] = (a - b).abs().max().item()
    assert gaps["bag"] < 1e-5 and gaps["temporal"] > 1e-3, gaps


def test_a_torchvision_video_network_is_one_override(tiny_world, tmp_path):
    """video_clip_tiny with R(2+1)D in place of the per-frame CNN: the data side follows the
    encoder's declared needs (size, Kinetics normalisation), and a step trains every weight."""
    cfg = _config("video_clip_tiny", tiny_world, tmp_path, [
        "model.encoders.video={type: video_backbone, backbone: {model_name: r2plus1d_18, "
        "image_size: 32}, tokens: time, temporal_layers: 1}",
    ])  # fmt: skip
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    batch = synthetic_batch(model, VocabInfo.from_tokenizer(tok))
    assert batch["frames"].shape[-2:] == (32, 32)
    model.train()
    out = model(batch)
    assert torch.isfinite(out.loss) and {"contrastive_loss", "contrastive_acc"} <= set(out.terms)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"no gradient reaches {missing}"
