"""Multiple choice (VCR): the choices plug-in, C rows a sample joined as BERT's pairs, the head
and VCR's Q→A / QA→R / Q→AR scores, by hand."""

from __future__ import annotations

import pytest
import torch

from mmptm.eval.vcr import vcr_scores
from mmptm.fusion.base import FusionOutput
from mmptm.modalities import DataContext
from mmptm.modalities.choices import ChoiceData, split_task_key, task_key
from mmptm.modalities.text import TextData
from mmptm.objectives.vcr import ChoiceRows, MultipleChoiceHead


class _Tok:
    """[CLS]=2 [SEP]=3 pad=0; a word is its length + 10 (enough to check the layout)."""

    pad_id, cls_id, sep_id = 0, 2, 3
    languages = ("en", "de")

    def encode(self, text: str) -> list[int]:
        return [10 + len(w) for w in text.split()]

    def build_inputs(self, a, b=None, max_len=64):
        a = a[: max_len - 2]
        return [2, *a, 3], [0] * (len(a) + 2)


def _choices(count=2, max_len=4) -> ChoiceData:
    cfg = ChoiceData.Config(count=count, max_len=max_len)
    return ChoiceData(cfg, views=["choices"], context=DataContext(tokenizer=_Tok()))


def test_choices_plugin_tokenizes_each_choice_and_checks_the_json():
    plug = _choices()
    a = plug.decode({}, {"choices": ["a bb", "ccc dddd eeeee"], "label": 1}, None)
    assert a == {"choice_ids": [[2, 11, 12, 3], [2, 13, 14, 3]], "choice_labels": 1}  # cut
    b = plug.decode({}, {"choices": ["x", "yy"], "label": 0}, None)
    batch = plug.collate([a, b])
    assert batch["choice_ids"].tolist() == [[[2, 11, 12, 3], [2, 13, 14, 3]],
                                            [[2, 11, 3, 0], [2, 12, 3, 0]]]  # fmt: skip
    assert batch["choice_mask"].sum(-1).tolist() == [[4, 4], [3, 3]]
    assert batch["choice_labels"].tolist() == [1, 0]
    bad = [({"choices": ["a"], "label": 0}, "list of 2"), ({"choices": ["a", " "], "label": 0},
           "non-empty"), ({"choices": ["a", "b"], "label": 2}, "choice index"),
           ({"choices": ["a", "b"], "label": True}, "choice index"),
           ({"choices": ["a", "b"]}, "choice index")]  # fmt: skip
    for meta, message in bad:
        with pytest.raises(ValueError, match=message):
            plug.decode({}, meta, None)
    with pytest.raises(ValueError, match="count must be >= 2"):
        _choices(count=1)


def test_rows_join_the_question_to_each_choice_in_the_text_layout():
    text = TextData(TextData.Config(), views=["text"], context=DataContext(tokenizer=_Tok()))
    samples = [{"input_ids": [2, 15, 3], "lang": "de"}, {"input_ids": [2, 16, 17, 3], "lang": "en"}]
    batch = {"__key__": ["q0-qa", "q1-qar"], **text.collate(samples)}
    batch["region_feats"] = torch.arange(2.0)[:, None, None].expand(2, 3, 5)
    batch["region_mask"] = torch.tensor([[True, True, False], [True, True, True]])
    plug = _choices()
    metas = [{"choices": ["a", "bb cc"], "label": 1}, {"choices": ["ddd", "e"], "label": 0}]
    batch.update(plug.collate([plug.decode({}, m, None) for m in metas]))
    rows = ChoiceRows()(batch, torch.Generator())
    (pack,) = text.transforms()
    out = pack(rows, torch.Generator())
    assert out["input_ids"].tolist() == [
        [2, 15, 3, 11, 3, 0],  # [CLS] q0 [SEP] choice 0 [SEP]
        [2, 15, 3, 12, 12, 3],
        [2, 16, 17, 3, 13, 3],
        [2, 16, 17, 3, 11, 3],
    ]
    assert out["segment_ids"][1].tolist() == [0, 0, 0, 1, 1, 1]
    assert out["attention_mask"].sum(1).tolist() == [5, 6, 6, 6]
    assert out["lang_ids"][:, 0].tolist() == [1, 1, 0, 0]  # the question's, on every row
    assert out["lang_ids"][0, :5].tolist() == [1] * 5
    assert out["__key__"] == ["q0-qa", "q0-qa", "q1-qar", "q1-qar"]
    assert out["region_feats"][:, 0, 0].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert out["region_mask"].sum(1).tolist() == [2, 2, 3, 3]
    assert out["choice_labels"].tolist() == [1, 0]  # one label a sample
    assert not [k for k in out if k.startswith(("text2_", "choice_ids", "choice_mask"))]
    # a text view with span annotations: a choice carries none, the question keeps its own
    spans = TextData(TextData.Config(spans={"entity": "entities"}), views=["text"],
                     context=DataContext(tokenizer=_Tok()))  # fmt: skip
    batch["entity_ids"] = torch.tensor([[-1, 7, -1, -1], [-1, -1, 8, -1]])
    batch["entity_mask"] = batch["entity_ids"] >= 0
    (pack,) = spans.transforms()
    out = pack(ChoiceRows()(batch, torch.Generator()), torch.Generator())
    q0, q1 = [-1, 7, -1, -1, -1, -1], [-1, -1, 8, -1, -1, -1]
    assert out["entity_ids"].tolist() == [q0, q0, q1, q1]
    assert out["entity_mask"].sum().item() == 4
    plain = {"input_ids": torch.zeros(2, 3)}
    assert ChoiceRows()(plain, torch.Generator()) is plain  # not a multiple-choice batch
    with pytest.raises(ValueError, match="already a pair"):
        ChoiceRows()({**batch, "text2_input_ids": torch.zeros(2, 2)}, torch.Generator())


def test_head_scores_each_row_and_takes_cross_entropy_over_the_choices():
    torch.manual_seed(0)
    head = MultipleChoiceHead(MultipleChoiceHead.Config(choices=4), width=3)
    pooled = torch.randn(8, 3)
    out = FusionOutput(hidden={}, mask={}, pooled={"joint": pooled})
    labels = torch.tensor([2, 0])
    got = head(out, {"choice_labels": labels})
    with torch.no_grad():
        scores = torch.stack([head.head(pooled[i]).squeeze() for i in range(8)]).reshape(2, 4)
    want = -(torch.log_softmax(scores, -1)[[0, 1], labels]).mean()
    torch.testing.assert_close(got["loss"], want)
    assert got["acc"].item() == pytest.approx((scores.argmax(-1) == labels).float().mean().item())
    with pytest.raises(ValueError, match="not 4 a sample"):
        head.logits(FusionOutput(hidden={}, mask={}, pooled={"joint": torch.randn(6, 3)}))
    assert head(out, {}) == {}
    assert head.data_needs()["choices"].facts == {"count": 4}


def test_vcr_scores_pair_each_questions_two_tasks():
    assert split_task_key(task_key("val-3", "qar")) == ("val-3", "qar")
    assert split_task_key("val-3") == ("val-3", "")
    right = {"a-qa": True, "a-qar": True, "b-qa": True, "b-qar": False, "c-qa": False,
             "c-qar": True, "d-qa": True, "other": False}  # fmt: skip
    got = vcr_scores(right)
    assert got["q_a"] == pytest.approx(300 / 4) and got["n_q_a"] == 4
    assert got["qa_r"] == pytest.approx(200 / 3) and got["n_qa_r"] == 3
    assert got["q_ar"] == pytest.approx(100 / 3) and got["n_q_ar"] == 3  # a only; d has no R
    assert got["accuracy"] == pytest.approx(500 / 8) and got["n"] == 8
