"""The generic decoder and collate: one json parse, plug-ins in order, seeded choices when
training and none when evaluating."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest
import torch

from mmptm.data.decode import Collate, Decoder
from mmptm.modalities.base import DataContext, Modality


class _Probe(Modality):
    """Records what it was given; draws a number when it gets a generator."""

    @dataclass
    class Config:
        type: str = "probe"

    registry_name = "probe"

    def decode(self, sample, meta, rng):
        draw = rng.random() if rng is not None else None
        return {"seen_meta": dict(meta), "draw": draw, "flag": meta.get("flag", 0)}

    def augment(self, item, rng):
        item["augmented"] = True
        return item

    def collate(self, samples):
        return {"flag": torch.tensor([s["flag"] for s in samples])}


def _probe() -> _Probe:
    return _Probe(_Probe.Config(), views=["probe"], context=DataContext())


def test_training_decodes_with_a_generator_per_sample_key_and_augments():
    dec = Decoder([_probe()], seed=3, epoch=1)
    sample = {"__key__": "k1", "json": json.dumps({"flag": 7}).encode()}
    out = dec(sample)
    assert out["__key__"] == "k1" and out["seen_meta"] == {"flag": 7} and out["augmented"]
    assert out["draw"] == random.Random("3/1/k1").random()  # seeded by (seed, epoch, key)
    assert dec(sample)["draw"] == out["draw"]
    assert Decoder([_probe()], seed=3, epoch=2)(sample)["draw"] != out["draw"]


def test_evaluation_makes_no_random_choice_and_no_augmentation():
    out = Decoder([_probe()], train=False)({"__key__": "k", "json": b"{}"})
    assert out["draw"] is None and "augmented" not in out


def test_json_must_be_an_object_and_is_optional():
    dec = Decoder([_probe()])
    with pytest.raises(ValueError, match="json member is a list"):
        dec({"__key__": "k", "json": b"[1, 2]"})
    assert dec({"__key__": "k"})["seen_meta"] == {}


def test_collate_asks_each_plugin_for_its_keys():
    samples = [{"__key__": "a", "flag": 1}, {"__key__": "b", "flag": 2}]
    batch = Collate([_probe()])(samples)
    assert batch["__key__"] == ["a", "b"] and batch["flag"].tolist() == [1, 2]
