"""A joined pair's layout (segments, separators, positions): BERT's, XLM's TLM and XLM-R's."""

from __future__ import annotations

import pytest
import torch

from mmptm.modalities import DataContext
from mmptm.modalities.text import PackPairs, TextData


class _Tok:
    """Just what collation and joining need: the pad and [SEP] ids, the language list."""

    pad_id = 0
    sep_id = 3
    languages = ("en", "de", "fr")


# [CLS]=2 [SEP]=3; words are ids >= 10.
PAIRS = [
    ([2, 10, 11, 3], "en", [2, 20, 21, 22, 3], "de"),
    ([2, 12, 3], "fr", [2, 23, 3], "en"),
]


def _text(**cfg) -> TextData:
    return TextData(TextData.Config(**cfg), views=["text"], context=DataContext(tokenizer=_Tok()))


def _joined(**cfg) -> dict:
    text = _text(**cfg)
    samples = [
        {"__key__": str(i), "input_ids": a, "lang": la, "text2_input_ids": b, "text2_lang": lb}
        for i, (a, la, b, lb) in enumerate(PAIRS)
    ]
    batch = {"__key__": [s["__key__"] for s in samples], **text.collate(samples)}
    (pack,) = text.transforms()
    assert isinstance(pack, PackPairs)
    return pack(batch, torch.Generator())


def test_xlmr_layout_two_separators_one_segment_positions_running_on():
    batch = _joined(segments=1, separators=2, restart_positions=False)
    # <s> a </s></s> b </s>: b's own <s> slot holds the second </s>
    assert batch["input_ids"].tolist() == [
        [2, 10, 11, 3, 3, 20, 21, 22, 3],
        [2, 12, 3, 3, 23, 3, 0, 0, 0],
    ]
    assert batch["attention_mask"].sum(1).tolist() == [9, 6]
    assert batch["segment_ids"].eq(0).all()
    assert batch["position_ids"][0].tolist() == list(range(9))
    assert batch["position_ids"][1, :6].tolist() == list(range(6))
    # the second separator belongs to the second sentence, as its language says
    assert batch["lang_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    assert not [k for k in batch if k.startswith("text2_")]


def test_two_separators_with_restarted_positions_and_two_segments():
    batch = _joined(segments=2, separators=2, restart_positions=True)
    assert batch["input_ids"][0].tolist() == [2, 10, 11, 3, 3, 20, 21, 22, 3]
    # b's tokens sit where they would alone; its separator takes its [CLS]'s position 0
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4]
    assert batch["segment_ids"][0].tolist() == [0] * 4 + [1] * 5
    assert batch["segment_ids"][1].tolist() == [0] * 3 + [1] * 3 + [0] * 3


def test_one_segment_with_one_separator():
    batch = _joined(segments=1, restart_positions=False)
    assert batch["input_ids"][0].tolist() == [2, 10, 11, 3, 20, 21, 22, 3]
    assert batch["segment_ids"].eq(0).all()
    assert batch["position_ids"][0].tolist() == list(range(8))


def test_the_default_layout_is_xlms_tlm():
    default, explicit = _joined(), _joined(segments=2, separators=1, restart_positions=True)
    assert default.keys() == explicit.keys()
    assert all(torch.equal(default[k], explicit[k]) for k in default if k != "__key__")
    assert default["input_ids"][0].tolist() == [2, 10, 11, 3, 20, 21, 22, 3]
    assert TextData.layout == ("segments", "separators", "restart_positions")


@pytest.mark.parametrize("key", ["segments", "separators"])
@pytest.mark.parametrize("value", [0, 3])
def test_layout_settings_are_checked(key, value):
    with pytest.raises(ValueError, match=rf"data\.modalities\.text\.{key} must be 1 or 2"):
        _text(**{key: value})
