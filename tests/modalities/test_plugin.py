"""Proof that a modality is a plug-in: a made-up one, defined entirely in this file (decode,
collate, encoder), is written to shards, pre-trained, checkpointed and evaluated with no
change to any file under mmptm/.

The modality: a 3-axis motion sensor, one ``sensor.npy`` member per sample holding
``[T, 3]`` readings of any length T. Its encoder declares how many axes it expects, which
the plug-in checks while decoding.
"""

from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from mmptm.data.shards import ShardWriter
from mmptm.encoders.base import Encoder, ModalityTokens
from mmptm.eval.retrieval import evaluate_retrieval
from mmptm.modalities.base import Modality, Need
from mmptm.models.load import load_pretrained
from mmptm.recipe import load_run_config
from mmptm.registry import ENCODERS, MODALITIES
from mmptm.train.trainer import pretrain


@MODALITIES.register("sensor")
class SensorData(Modality):
    """``sensor.npy`` [T,3] → ``sensor_values [B,T,3]`` + ``sensor_mask [B,T]``."""

    members: ClassVar[tuple[str, ...]] = ("sensor.npy",)
    keys: ClassVar[tuple[str, ...]] = ("sensor_values", "sensor_mask")

    @dataclass
    class Config:
        type: str = "sensor"
        #: readings kept per sample (a recipe setting)
        max_steps: int = 32
        #: axes per reading (a fact the encoder declares)
        axes: int = 0

    def decode(self, sample, meta, rng):
        if "sensor.npy" not in sample:
            raise ValueError(f"no sensor.npy member; has {sorted(sample)}")
        x = np.load(io.BytesIO(sample["sensor.npy"]), allow_pickle=False)
        if x.ndim != 2 or x.shape[1] != self.cfg.axes or not np.isfinite(x).all():
            raise ValueError(f"sensor readings {x.shape} are not finite [T, {self.cfg.axes}]")
        start = rng.randrange(max(len(x) - self.cfg.max_steps, 0) + 1) if rng else 0
        return {"sensor_values": torch.from_numpy(x[start : start + self.cfg.max_steps]).float()}

    def collate(self, samples):
        lengths = [len(s["sensor_values"]) for s in samples]
        values = torch.zeros(len(samples), max(lengths), self.cfg.axes)
        for i, s in enumerate(samples):
            values[i, : lengths[i]] = s["sensor_values"]
        mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
        return {"sensor_values": values, "sensor_mask": mask}


@ENCODERS.register("sensor_mlp")
class SensorEncoder(Encoder):
    """Each reading → a token at the fusion width, plus a learned position."""

    modality = "sensor"
    main_key = "sensor_values"

    @dataclass
    class Config:
        type: str = "sensor_mlp"
        axes: int = 3
        max_steps: int = 64

    def __init__(self, cfg: Config, *, width: int, name: str = "sensor", **_: Any) -> None:
        super().__init__(width, name)
        self.cfg = cfg
        self.proj = nn.Sequential(nn.Linear(cfg.axes, width), nn.GELU(), nn.Linear(width, width))
        self.pos = nn.Parameter(torch.zeros(cfg.max_steps, width))

    def data_needs(self) -> dict[str, Need]:
        return {self.view: Need(self.modality, {"axes": self.cfg.axes})}

    def forward(self, batch: dict) -> ModalityTokens:
        x_BTA, mask_BT = batch["sensor_values"], batch["sensor_mask"]
        x_BTD = self.proj(x_BTA) + self.pos[: x_BTA.shape[1]]
        return ModalityTokens(self.add_type(x_BTD), mask_BT)


SHAPES = ("circle", "square", "triangle")


def _signal(shape: int, rng: random.Random) -> np.ndarray:
    """A shape's gesture: its own frequency on each axis, random length and phase."""
    t = np.arange(rng.randint(8, 40))
    phase = rng.uniform(0, 2 * math.pi)
    axes = [np.sin((shape + 1) * (k + 1) * 0.3 * t + phase) for k in range(3)]
    return np.stack(axes, axis=1).astype(np.float32)


def _write_shards(root, n: int, split: str, seed: int) -> str:
    rng = random.Random(seed)
    with ShardWriter(str(root / f"{split}-%06d.tar"), 16) as w:
        for i in range(n):
            shape = i % len(SHAPES)
            buf = io.BytesIO()
            np.save(buf, _signal(shape, rng))
            w.write({"__key__": f"{split}{i:04d}", "sensor.npy": buf.getvalue(),
                     "txt": f"a {SHAPES[shape]}"})  # fmt: skip
        if split == "train":  # a corrupt reading: skipped and counted, never zeros
            w.write({"__key__": "bad", "sensor.npy": b"not npy", "txt": "a circle"})
    return str(root / f"{split}-*.tar")


RECIPE = {
    "output_dir": "",
    "data": {
        "batch_size": 8,
        "shuffle_buffer": 8,
        "modalities": {"sensor": {"max_steps": 24}, "text": {"max_len": 12}},
    },
    "model": {
        "width": 32,
        "encoders": {
            "text": {"type": "text", "max_positions": 16},
            "sensor": {"type": "sensor_mlp", "axes": 3},
        },
        "fusion": {"type": "dual", "transformer": {"layers": 1, "heads": 2}},
        "objectives": {"contrastive": {"type": "contrastive", "modalities": ["sensor", "text"]}},
    },
    "train": {
        "max_steps": 6,
        "warmup_steps": 1,
        "log_every": 1,
        "ckpt_every": 6,
        "progress": False,
        "lr": 3e-3,
    },
}


def test_a_modality_defined_outside_the_package_pretrains_and_evaluates(
    tiny_world, tmp_path, caplog
):
    train = _write_shards(tmp_path, 48, "train", seed=0)
    test = _write_shards(tmp_path, 12, "test", seed=1)
    recipe = tmp_path / "sensor_clip.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    run = tmp_path / "run"
    cfg = load_run_config(
        str(recipe),
        [f"output_dir={run}", f"data.train={train}", f"data.test={test}",
         f"data.tokenizer={tiny_world}/tokenizer.model"],
    )  # fmt: skip
    last = pretrain(cfg)
    assert last["step"] == 6 and math.isfinite(last["loss"]) and last["data_skipped"] == 1
    assert "sample 'bad' in" in caplog.text and "train-000003.tar" in caplog.text  # named

    model, _, saved = load_pretrained(str(run))
    assert saved.data.modalities["sensor"].max_steps == 24  # the recipe's setting, saved
    needs = model.data_needs()
    assert needs["sensor"] == Need("sensor", {"axes": 3}) and needs["text"] == Need("text")
    result = evaluate_retrieval(str(run), split="test", max_items=12, batch_size=5)
    assert result["n"] == 12
    assert 0.0 <= result["i2t_R@1"] <= result["i2t_R@5"] <= 1.0


def test_the_encoders_declared_fact_reaches_the_plugin(tiny_world, tmp_path):
    from mmptm.data.pipeline import stream_config
    from mmptm.models.load import build_model

    train = _write_shards(tmp_path, 8, "train", seed=0)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    over = [f"data.train={train}", f"data.tokenizer={tiny_world}/tokenizer.model",
            "model.encoders.sensor.axes=2"]  # fmt: skip
    cfg = load_run_config(str(recipe), over)
    model, tok = build_model(cfg)
    stream = stream_config(cfg.data, tok, needs=model.data_needs())
    (sensor,) = [m for m in stream.modalities if m.name == "sensor"]
    assert sensor.cfg.axes == 2 and sensor.cfg.max_steps == 24
    with pytest.raises(ValueError, match=r"not finite \[T, 2\]"):  # 3-axis shards, 2 declared
        stream.decoder(next(iter(_raw(train))))


def _raw(spec: str):
    from mmptm.data.shards import SkipCounter, expand_shards, tar_samples

    return tar_samples(expand_shards(spec), SkipCounter())


PLUGIN_MODULE = '''
"""An out-of-tree part: a scalar "heart rate" modality and its encoder."""
from dataclasses import dataclass

import torch
from torch import nn

from mmptm.encoders.base import Encoder, ModalityTokens
from mmptm.modalities.base import Modality
from mmptm.registry import ENCODERS, MODALITIES


@MODALITIES.register("pulse")
class PulseData(Modality):
    members = ("pulse.txt",)
    keys = ("pulse",)

    @dataclass
    class Config:
        type: str = "pulse"

    def decode(self, sample, meta, rng):
        return {"pulse": float(sample["pulse.txt"])}

    def collate(self, samples):
        return {"pulse": torch.tensor([[s["pulse"]] for s in samples])}


@ENCODERS.register("pulse_linear")
class PulseEncoder(Encoder):
    modality = "pulse"
    main_key = "pulse"

    @dataclass
    class Config:
        type: str = "pulse_linear"

    def __init__(self, cfg, *, width, name="pulse", **_):
        super().__init__(width, name)
        self.proj = nn.Linear(1, width)

    def forward(self, batch):
        x = self.add_type(self.proj(batch["pulse"]))[:, None]
        return ModalityTokens(x, torch.ones(x.shape[:2], dtype=torch.bool))
'''


def test_a_recipe_names_out_of_tree_parts_in_plugins(tiny_world, tmp_path, monkeypatch):
    from mmptm.cli import main

    (tmp_path / "pulse_plugin.py").write_text(PLUGIN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    with ShardWriter(str(tmp_path / "train-%06d.tar"), 100) as w:
        for i in range(16):
            w.write({"__key__": f"k{i}", "pulse.txt": str(60 + i), "txt": "a red circle"})
    recipe = {
        **RECIPE,
        "plugins": ["pulse_plugin"],
        "data": {"batch_size": 4, "shuffle_buffer": 4},
        "model": {
            **RECIPE["model"],
            "encoders": {"text": {"type": "text"}, "pulse": {"type": "pulse_linear"}},
            "objectives": {"c": {"type": "contrastive", "modalities": ["pulse", "text"]}},
        },
    }
    (tmp_path / "pulse.yaml").write_text(yaml.safe_dump(recipe))
    run = tmp_path / "run"
    over = [f"output_dir={run}", f"data.train={tmp_path}/train-*.tar",
            f"data.tokenizer={tiny_world}/tokenizer.model", "train.max_steps=2"]  # fmt: skip
    assert main(["pretrain", str(tmp_path / "pulse.yaml"), *over]) == 0
    model, _, cfg = load_pretrained(str(run))
    assert (
        cfg.plugins == ["pulse_plugin"] and type(model.encoders["pulse"]).__name__ == "PulseEncoder"
    )
    bad = [*over, "plugins=[no_such_module]"]
    assert main(["pretrain", str(tmp_path / "pulse.yaml"), *bad]) == 2  # one line, no traceback
