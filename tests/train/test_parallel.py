"""Activation checkpointing: the gradients of the plain model, with each block run twice."""

from __future__ import annotations

import copy

import torch
from conftest import text_image_model_config

from mmptm.encoders.base import VocabInfo
from mmptm.models.pretrain import PretrainModel, data_transforms
from mmptm.train.parallel import checkpoint_blocks, find_blocks

VOCAB = VocabInfo(vocab_size=50, special_ids=frozenset({0, 1, 2, 3, 4}))
BLOCKS = ["TransformerBlock", "Block"]


def _model() -> PretrainModel:
    """Text + a one-block ViT, one fusion layer, MLM + ITM; dropout everywhere, so that a
    recomputed block must replay its random masks."""
    vit = {"img_size": 16, "patch_size": 8, "embed_dim": 16, "depth": 1, "num_heads": 2,
           "proj_drop_rate": 0.2, "attn_drop_rate": 0.2}  # fmt: skip
    cfg = text_image_model_config()
    cfg.encoders["image"].backbone.model_kwargs = vit
    torch.manual_seed(0)
    return PretrainModel(cfg, VOCAB).train()


def _batch(model: PretrainModel) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50, (6, 10), generator=g)
    ids[:, 0] = 2
    batch = {"__key__": [str(i) for i in range(6)], "input_ids": ids,
             "attention_mask": torch.arange(10)[None] < torch.tensor([10, 9, 8, 7, 6, 5])[:, None],
             "pixels": torch.randn(6, 3, 16, 16, generator=g)}  # fmt: skip
    for t in data_transforms(model.cfg, VOCAB):
        batch = t(batch, g)
    return batch


def _grads(model: PretrainModel, batch: dict) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    model(batch).loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def test_checkpointed_blocks_give_the_plain_gradients_and_run_twice():
    plain = _model()
    recomputing = copy.deepcopy(plain)
    calls: list[str] = []
    for name, block in recomputing.named_modules():
        if type(block).__name__ in BLOCKS:
            forward = block.forward
            block.forward = lambda *a, _f=forward, _n=name, **k: calls.append(_n) or _f(*a, **k)
    blocks = checkpoint_blocks(recomputing, BLOCKS)
    assert {type(b).__name__ for b in blocks} == {"TransformerBlock", "Block"}
    batch = _batch(plain)
    expected = _grads(plain, batch)
    got = _grads(recomputing, batch)
    assert got.keys() == expected.keys() and len(got) == len(list(plain.parameters()))
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)
    names = [n for n, b in recomputing.named_modules() if b in blocks]
    assert sorted(calls) == sorted(names * 2)  # forward, then again in backward
    # names, and so state dicts and checkpoints, are unchanged
    assert recomputing.state_dict().keys() == plain.state_dict().keys()


def test_blocks_are_found_by_class_name_children_first():
    from torch import nn

    class Block(nn.Module):  # a block holding blocks, as a user's recipe might
        def __init__(self, inner: int) -> None:
            super().__init__()
            self.inner = nn.ModuleList(Block(0) for _ in range(inner))

    model = nn.Sequential(Block(2), nn.Linear(2, 2))
    found = find_blocks(model, ["Block"])
    assert found == [model[0].inner[0], model[0].inner[1], model[0]]  # FSDP wraps inner first
    assert find_blocks(model, ["Linear", "Nothing"]) == [model[1]]
