"""Oscar's object tags: the regions' detector labels as the text's second segment, the
polluted-tags matching objective, and MLM over caption and tags. The oracle for the tags is
each sample's ``json`` (its objects' shapes), which the plug-in never reads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import read_shard_samples, tiny_overrides

from mmptm.data.pipeline import Loader, stream_config
from mmptm.encoders.base import VocabInfo
from mmptm.modalities import DataContext
from mmptm.modalities.regions import regions_npz_bytes
from mmptm.modalities.text import TextData
from mmptm.models.load import build_model
from mmptm.models.pretrain import data_transforms
from mmptm.objectives.mlm import IGNORE
from mmptm.recipe import load_run_config

RECIPE = "oscar_tiny"


def _first_batch(world, tmp_path, *over: str) -> tuple[dict, object]:
    cfg = load_run_config(RECIPE, [*tiny_overrides(world, tmp_path, "oscar_tiny"), *over])
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    stream = stream_config(
        cfg.data,
        tok,
        needs=model.data_needs(),
        transforms=data_transforms(cfg.model, VocabInfo.from_tokenizer(tok)),
    )
    return next(iter(Loader(stream, 0))), tok


def _jsons(world) -> dict[str, dict]:
    """Sample key → its json member, for the regions view's train split."""
    samples = read_shard_samples(sorted(map(str, (world / "regions").glob("train-*.tar"))))
    return {key: json.loads(m["json"]) for key, m in samples}


def _shapes(world) -> dict[str, str]:
    """Sample key → its objects' shapes, left to right, from the json member."""
    return {key: " ".join(o["shape"] for o in m["objects"]) for key, m in _jsons(world).items()}


def _segment(batch: dict, tok, i: int, seg: int) -> str:
    """Row i's text in segment ``seg``, without [CLS]/[SEP]."""
    real = batch["attention_mask"][i] & (batch["segment_ids"][i] == seg)
    ids = [int(t) for t in batch["input_ids"][i][real] if int(t) not in tok.special_ids]
    return tok.decode(ids)


def test_tags_are_the_second_segment_with_segment_id_1(tiny_world, tmp_path):
    # Almost no masking, so the ids are the sample's own.
    batch, tok = _first_batch(tiny_world, tmp_path, "model.objectives.mlm.mask_prob=1e-6")
    shapes = _shapes(tiny_world)
    positives = (batch["itm_labels"] == 1).nonzero().flatten().tolist()
    assert positives
    for i in positives:
        key = batch["__key__"][i]
        assert _segment(batch, tok, i, 1) == shapes[key]
        n = int(batch["attention_mask"][i].sum())
        ids, seg = batch["input_ids"][i][:n].tolist(), batch["segment_ids"][i][:n].tolist()
        # [CLS] caption [SEP] tags [SEP]: one [CLS], a [SEP] closing each segment
        assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id
        first_tag = seg.index(1)
        assert ids[first_tag - 1] == tok.sep_id and seg[:first_tag] == [0] * first_tag
        assert seg[first_tag:] == [1] * (n - first_tag)
        # BERT's pair layout: positions run on into the tags
        assert batch["position_ids"][i][:n].tolist() == list(range(n))
    assert not [k for k in batch if k.startswith("text2_")]


def test_polluted_samples_carry_another_samples_tags(tiny_world, tmp_path):
    batch, tok = _first_batch(tiny_world, tmp_path, "model.objectives.mlm.mask_prob=1e-6")
    shapes, metas = _shapes(tiny_world), _jsons(tiny_world)
    keys = batch["__key__"]
    labels = batch["itm_labels"].tolist()
    assert 0 in labels and 1 in labels
    for i, label in enumerate(labels):
        tags = _segment(batch, tok, i, 1)
        others = {shapes[k] for j, k in enumerate(keys) if j != i}
        if label == 1:
            assert tags == shapes[keys[i]]
        else:  # polluted: some other row's tags (which may, by chance, read the same)
            assert tags in others
        # the caption is always the row's own (cut at max_len pieces)
        caption = _segment(batch, tok, i, 0)
        assert len(caption) > 20 and metas[keys[i]]["captions"]["en"].startswith(caption)


def test_mlm_masks_caption_and_tags_and_polluted_tags_carry_no_labels(tiny_world, tmp_path):
    batch, tok = _first_batch(
        tiny_world, tmp_path, "model.objectives.mlm.mask_prob=0.5", "data.batch_size=16"
    )
    labels, seg = batch["mlm_labels"], batch["segment_ids"]
    real = batch["attention_mask"]
    pos = (batch["itm_labels"] == 1)[:, None]
    has = labels != IGNORE
    assert (has & pos & (seg == 1)).sum() > 0  # tags of aligned samples are predicted
    assert (has & pos & (seg == 0)).sum() > 0
    assert (has & ~pos & (seg == 0)).sum() > 0  # a polluted sample's caption still is
    assert (has & ~pos & (seg == 1)).sum() == 0  # its foreign tags are not
    assert not (has & ~real).any()
    # Labels at tag positions are the tag words' pieces
    tag_pieces = {i for name in ("circle", "square", "triangle", "diamond", "star")
                  for i in tok.encode(name)}  # fmt: skip
    assert set(labels[has & (seg == 1)].tolist()) <= tag_pieces


def _sample(labels, captions=None) -> tuple[dict, dict]:
    r = 2 if labels is None else len(labels)
    record = {
        "features": np.zeros((r, 4), np.float32),
        "boxes": np.tile(np.array([0.1, 0.1, 0.5, 0.5], np.float32), (r, 1)),
        "image_size": (32, 32),
        "labels": None if labels is None else np.array(labels),
    }
    meta = {"captions": captions or {"en": "a red circle"}}
    return {"regions.npz": regions_npz_bytes(record), "json": json.dumps(meta).encode()}, meta


def _tags_plugin(tok) -> TextData:
    cfg = TextData.Config(tag_classes=["circle", "square"])
    return TextData(cfg, views=["text"], context=DataContext(tokenizer=tok))


def test_tags_keep_region_order_and_repeats(tiny_tokenizer):
    sample, meta = _sample([1, 0, 1])
    out = _tags_plugin(tiny_tokenizer).decode(sample, meta, None)
    assert tiny_tokenizer.decode(out["text2_input_ids"][1:-1]) == "square circle square"
    assert tiny_tokenizer.decode(out["input_ids"][1:-1]) == "a red circle"


@pytest.mark.parametrize(
    ("labels", "drop", "match"),
    [
        ([0, 2], False, "label 2 has no name in tag_classes"),
        (None, False, "has none"),
        ([0], True, "need a regions.npz member"),
    ],
)
def test_bad_tags_are_bad_samples(tiny_tokenizer, labels, drop, match):
    sample, meta = _sample(labels)
    if drop:
        del sample["regions.npz"]
    with pytest.raises(ValueError, match=match):
        _tags_plugin(tiny_tokenizer).decode(sample, meta, None)


def test_tags_need_one_text_view(tiny_tokenizer):
    cfg = TextData.Config(tag_classes=["circle"])
    with pytest.raises(ValueError, match="second segment of one text view"):
        TextData(cfg, views=["text", "text2"], context=DataContext(tokenizer=tiny_tokenizer))
