"""The knowbert fusion: single_stream's parameter names plus KAR and the entity table (a BERT
run loads into it), spans shifted to the text's place in the joined sequence, settings
checked, and a row's output independent of the other rows' span padding."""

from __future__ import annotations

import pytest
import torch

from mmptm.encoders.base import ModalityTokens
from mmptm.encoders.entities import EntityTableConfig
from mmptm.fusion.knowbert import KnowBertFusion
from mmptm.fusion.single_stream import SingleStreamFusion
from mmptm.layers import TransformerConfig


def _fusion(**kw) -> KnowBertFusion:
    cfg = KnowBertFusion.Config(
        transformer=TransformerConfig(layers=3, heads=2, dropout=0.0, attn_dropout=0.0),
        entity_dim=8, kar_heads=2, entities=EntityTableConfig(num_entities=6, dim=8), **kw,
    )  # fmt: skip
    torch.manual_seed(0)
    return KnowBertFusion(cfg, width=16).eval()


def test_a_single_stream_state_loads_and_only_kar_and_the_table_are_new():
    bert = SingleStreamFusion(
        SingleStreamFusion.Config(transformer=TransformerConfig(layers=3, heads=2)), width=16
    )
    fusion = _fusion(kar_after=[2, 3])
    missing, unexpected = fusion.load_state_dict(bert.state_dict(), strict=False)
    assert unexpected == []
    assert {k.split(".")[0] for k in missing} == {"kar", "entities"}
    assert sorted(fusion.kar) == ["2", "3"]
    torch.testing.assert_close(
        fusion.stack.blocks[0].attn.q.weight, bert.stack.blocks[0].attn.q.weight
    )


@pytest.mark.parametrize("after", [[], [0], [4], [3, 2]])
def test_kar_after_must_name_layers_of_the_stack(after):
    with pytest.raises(ValueError, match="kar_after must be increasing layers in 1..3"):
        _fusion(kar_after=after)


def test_spans_move_to_the_text_place_and_padding_rows_change_nothing():
    fusion = _fusion(kar_after=[2])
    x = torch.randn(2, 5, 16)
    other = ModalityTokens(torch.randn(2, 3, 16), torch.ones(2, 3, dtype=torch.bool))
    text = ModalityTokens(x, torch.ones(2, 5, dtype=torch.bool))
    batch = {
        "candidate_spans": torch.tensor([[[1, 2], [-1, -1]], [[3, 3], [1, 1]]]),
        "candidate_ids": torch.tensor([[[0, 1], [-1, -1]], [[2, -1], [3, 4]]]),
        "candidate_priors": torch.tensor([[[0.6, 0.4], [0, 0]], [[1.0, 0], [0.5, 0.5]]]),
    }
    spans, _, _ = fusion.candidates({"regions": other, "text": text}, batch)
    assert spans.tolist() == [[[4, 5], [-1, -1]], [[6, 6], [4, 4]]]  # 3 region tokens first
    both = fusion({"text": text}, batch)
    # row 0 alone, its padding span cut away
    alone = {k: v[:1, :1] for k, v in batch.items()}
    one = fusion({"text": ModalityTokens(x[:1], text.mask[:1])}, alone)
    torch.testing.assert_close(one.hidden["text"], both.hidden["text"][:1])
    torch.testing.assert_close(one.link[2], both.link[2][:1, :1])
