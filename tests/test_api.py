"""The public API (``import mmptm``): each call against the library path it stands for, and
the README's Python example run as a user would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, tiny_overrides
from PIL import Image

import mmptm
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.models.load import count_parameters
from mmptm.recipe import load_recipe
from mmptm.search.sides import DualEncoder


def test_import_is_light_and_exports_all():
    code = "import sys, mmptm; print('torch' in sys.modules, mmptm.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", mmptm.__version__]
    for name in mmptm.__all__:
        assert getattr(mmptm, name) is not None
    with pytest.raises(AttributeError):
        mmptm.no_such_thing  # noqa: B018


def test_list_recipes_and_parts():
    assert {"clip_tiny", "vqa", "wav2vec2_tiny"} <= set(mmptm.list_recipes())
    audio = mmptm.list_recipes(modality="audio")
    assert "clap_tiny" in audio and "clip_tiny" not in audio
    parts = mmptm.list_parts()
    assert set(parts) == {"modality", "encoder", "fusion", "objective"}
    assert "single_stream" in parts["fusion"] and "contrastive" in parts["objective"]
    assert mmptm.list_parts("fusion") == {"fusion": parts["fusion"]}
    with pytest.raises(ValueError, match="unknown kind of part 'fusions'"):
        mmptm.list_parts("fusions")


def test_create_model_is_the_trainers_initial_model(tiny_world, tmp_path):
    from mmptm.train.trainer import Trainer

    over = tiny_overrides(tiny_world, tmp_path / "run", "clip_tiny")
    model = mmptm.create_model("clip_tiny", *over)
    trained = Trainer(load_recipe("clip_tiny", over)).model
    ours, theirs = model.state_dict(), trained.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], rtol=0, atol=0)


def test_create_model_keywords_and_vocab_size():
    # no tokenizer file here: the recipe's info.vocab_size stands in (the meta-device count)
    model = mmptm.create_model("clip_tiny", width=48, fusion__type="dual")
    cfg = load_recipe("clip_tiny", ["model.width=48"])
    assert model.cfg.width == 48
    assert sum(p.numel() for p in model.parameters()) == count_parameters(cfg, cfg.info.vocab_size)
    small = mmptm.create_model("clip_tiny", vocab_size=50)
    assert small.encoders["text"].word.weight.shape[0] == 50
    with pytest.raises(ValueError, match="unknown key 'model.widht'"):
        mmptm.create_model("clip_tiny", widht=48)
    with pytest.raises(ValueError, match="clip_tny.*clip_tiny"):
        mmptm.create_model("clip_tny")


def _test_images(world: Path, n: int) -> list[dict]:
    urls = expand_shards(f"{world}/image_text/test-*.tar")
    return [s for _, s in zip(range(n), tar_samples(urls, SkipCounter()))]


def test_load_embeds_as_the_search_index_does(tiny_clip_run, tiny_world, tmp_path):
    run = mmptm.load(tiny_clip_run)
    assert run.dual is not None and not run.model.training
    samples = _test_images(tiny_world, 4)
    reference, _ = DualEncoder.load(str(tiny_clip_run))
    want = reference.embed_samples("image", samples)
    paths = []
    for s in samples:
        paths.append(tmp_path / f"{s['__key__']}.jpg")
        paths[-1].write_bytes(s["jpg"])
    pictures = [Image.open(p) for p in paths]  # decoded, then handed over as PNG: same pixels
    for given in (paths, [s["jpg"] for s in samples], pictures):
        np.testing.assert_allclose(run.embed_images(given), want, atol=1e-5)
    texts = run.embed_text(["a red circle", "ein Kreis"], lang=["en", "de"])
    assert texts.shape == (2, want.shape[1])
    np.testing.assert_allclose(np.linalg.norm(texts, axis=1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="2 sentences but 1 languages"):
        run.embed_text(["a", "b"], lang=["en"])
    with pytest.raises(ValueError, match="no audio side"):
        run.embed_audio([b"RIFF"])
    batch = run.batch(samples)  # the transforms: raw shard samples → the model's batch
    assert batch["pixels"].shape[0] == 4 and batch["input_ids"].shape[0] == 4


def test_pretrain_and_finetune(tiny_world, tmp_path):
    over = tiny_overrides(tiny_world, tmp_path / "mlm", "mbert_tiny")
    last = mmptm.pretrain("mbert_tiny", *over, "train.max_steps=2")
    assert last["step"] == 2 and np.isfinite(last["loss"])
    out = mmptm.finetune(
        "xnli", str(tmp_path / "mlm"), f"output_dir={tmp_path / 'xnli'}",
        f"data.train={tiny_world}/nli/train-en-*.tar", "data.eval=__delete__",
        f"data.eval.en={tiny_world}/nli/test-en-*.tar",
        "data.batch_size=8", "data.num_workers=0", "train.max_steps=2", "train.progress=false",
    )  # fmt: skip
    assert out["last"]["step"] == 2 and 0.0 <= out["eval"]["en"] <= 1.0
    assert (tmp_path / "xnli" / "eval.json").is_file()
    with pytest.raises(ValueError, match="finetune needs init="):
        mmptm.finetune("xnli", None, "init=''", f"output_dir={tmp_path / 'x'}")


def test_readme_example_runs(tiny_clip_run, tiny_world, tmp_path):
    """The README's Python example, as written, in a folder holding what it names."""
    block = re.search(r"```python\n(import mmptm\n.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "demo-clip").symlink_to(tiny_clip_run)
    (tmp_path / "photo.jpg").write_bytes(_test_images(tiny_world, 1)[0]["jpg"])
    (tmp_path / "example.py").write_text(block.group(1))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "clap_tiny" in out.stdout and re.search(r"\[\[ *-?\d", out.stdout)
