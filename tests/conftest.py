"""Shared fixtures: a tiny toyworld data set and tokenizer, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmptm.data import toyworld
from mmptm.data.tokenizer import Tokenizer, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> Path:
    """toyworld with 96 train / 32 val / 32 test scenes in shards of 16, plus a tokenizer."""
    out = tmp_path_factory.mktemp("toyworld")
    toyworld.generate(out, n_train=96, n_val=32, n_test=32, seed=0, image_size=32, shard_size=16)
    shards = sorted((out / "image_text").glob("train-*.tar"))
    train_tokenizer(shards, out / "tokenizer", vocab_size=400, seed=0, num_threads=1)
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_world: Path) -> Tokenizer:
    return Tokenizer.load(tiny_world / "tokenizer.model")


def tiny_overrides(world: Path, out: Path, recipe: str = "clip_tiny") -> list[str]:
    """Overrides that point a tiny recipe at ``tiny_world`` and shrink it for tests."""
    common = [
        f"output_dir={out}",
        f"data.train={world}/image_text/train-*.tar",
        f"data.val={world}/image_text/val-*.tar",
        f"data.test={world}/image_text/test-*.tar",
        f"data.tokenizer={world}/tokenizer.model",
        "data.batch_size=8",
        "data.num_workers=0",
        "data.shuffle_buffer=20",
        "data.image_size=32",
        "model.width=32",
        "model.encoders.image.image_size=32",
        "train.max_steps=6",
        "train.warmup_steps=2",
        "train.log_every=1",
        "train.ckpt_every=3",
        "train.progress=false",
    ]
    if recipe.startswith("vilt"):
        common += [
            "model.encoders.image.model_kwargs={img_size: 32, patch_size: 8, embed_dim: 32, "
            "depth: 0, num_heads: 2}",
            "model.fusion.transformer.layers=2",
            "model.fusion.transformer.heads=2",
        ]
    else:
        common += ["model.fusion.transformer.heads=2"]
    return common
