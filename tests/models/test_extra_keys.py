"""A fusion module that declares an extra batch key gets it, aligned with the tokens it fuses,
through decoding, TLM pair packing and the model's forward pass (what ERNIE-style entity
fusion needs); a model that declares nothing of the kind decodes no such key."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from torch import nn

from mmptm.config import from_dict
from mmptm.data.pipeline import ShardStream, stream_config
from mmptm.data.shards import ShardWriter
from mmptm.encoders.base import VocabInfo
from mmptm.fusion.base import Fusion, FusionOutput, pool
from mmptm.layers import TransformerConfig, TransformerStack
from mmptm.modalities.base import Need
from mmptm.models.pretrain import PretrainModel, data_transforms
from mmptm.recipe import DataConfig, ModelConfig
from mmptm.registry import FUSIONS


@FUSIONS.register("entity_sum_test")
class EntitySum(Fusion):
    """Adds an embedding of the entity at each mention's first piece, then a Transformer."""

    @dataclass
    class Config:
        type: str = "entity_sum_test"
        entities: int = 10
        transformer: TransformerConfig = field(default_factory=lambda: TransformerConfig(layers=1))

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        self.entity = nn.Embedding(cfg.entities, width)
        self.stack = TransformerStack(width, cfg.transformer)
        self.seen: list[torch.Tensor] = []

    def data_needs(self) -> dict[str, Need]:
        return {"text": Need("text", {"spans": {"entity": "entities"}})}

    def forward(self, tokens, batch=None) -> FusionOutput:
        t = tokens["text"]
        ids_BL = batch["entity_ids"]
        self.seen.append(ids_BL)
        x_BLD = t.tokens + torch.where(
            (ids_BL >= 0)[..., None], self.entity(ids_BL.clamp_min(0)), 0.0
        )
        h = self.stack(x_BLD, t.mask)
        return FusionOutput({"text": h}, {"text": t.mask}, {"text": pool(h, t.mask, "first")})


def test_a_fusion_reads_entity_ids_aligned_through_pair_packing(
    tiny_world, tiny_tokenizer, tmp_path
):
    pairs = [
        ("the red circle", "der rote Kreis", 3, 4),
        ("a blue square", "ein blaues Quadrat", 5, 6),
    ]
    with ShardWriter(str(tmp_path / "p-%06d.tar"), 10) as w:
        for i, (en, de, e_en, e_de) in enumerate(pairs * 4):
            meta = {"languages": ["en", "de"], "texts": [en, de],
                    "entities": [[[4, len(en), e_en]], [[4, len(de), e_de]]]}  # fmt: skip
            w.write({"__key__": f"k{i}", "json": json.dumps(meta)})
    model_cfg = from_dict(
        ModelConfig,
        {
            "width": 16,
            "encoders": {"text": {"type": "text", "max_positions": 32}},
            "fusion": {"type": "entity_sum_test", "transformer": {"layers": 1, "heads": 2}},
            "objectives": {"mlm": {"type": "mlm"}},
        },
    )
    vocab = VocabInfo.from_tokenizer(tiny_tokenizer)
    model = PretrainModel(model_cfg, vocab)
    assert model.data_needs()["text"].facts == {"spans": {"entity": "entities"}}
    data = DataConfig(train=str(tmp_path / "p-*.tar"), batch_size=4, shuffle_buffer=1)
    stream = stream_config(
        data, tiny_tokenizer, needs=model.data_needs(), transforms=data_transforms(model_cfg, vocab)
    )
    batch = next(iter(ShardStream(stream, epoch=0)))
    ids, mask = batch["entity_ids"], batch["entity_mask"]
    assert ids.shape == batch["input_ids"].shape == mask.shape  # one sequence: pairs joined
    for b in range(4):
        # Each joined pair carries its two mentions, one per sentence, at the first piece of
        # the span: segment 0 holds the first sentence's, segment 1 the second's.
        seg = batch["segment_ids"][b]
        firsts = ids[b][ids[b] >= 0]
        assert sorted(firsts.tolist()) in ([3, 4], [5, 6])  # both languages' mention ids
        assert set(seg[ids[b] >= 0].tolist()) == {0, 1}
        assert mask[b].sum() >= 2 and not mask[b][0]
    out = model(batch)
    out.loss.backward()
    assert model.fusion.seen[-1] is batch["entity_ids"]
    assert (
        model.fusion.entity.weight.grad is not None
        and model.fusion.entity.weight.grad.abs().sum() > 0
    )


def test_keys_nobody_declares_are_not_decoded(tiny_tokenizer, tmp_path):
    with ShardWriter(str(tmp_path / "p-%06d.tar"), 10) as w:
        for i in range(4):
            meta = {"captions": {"en": "the red circle"}, "entities": {"en": [[4, 14, 1]]}}
            w.write({"__key__": f"k{i}", "json": json.dumps(meta), "txt": "x"})
    data = DataConfig(train=str(tmp_path / "p-*.tar"), batch_size=4, shuffle_buffer=1)
    stream = stream_config(data, tiny_tokenizer, needs={"text": Need("text")})
    batch = next(iter(ShardStream(stream, epoch=0)))
    assert "input_ids" in batch and not any(k.startswith("entity") for k in batch)
