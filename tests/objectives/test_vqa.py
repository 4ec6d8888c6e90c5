"""VQA's objective: official normalisation and soft score (hand-worked), soft targets, head.

Legend: B batch, D width, A answers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmptm.converters.answers import write_answer_vocab
from mmptm.fusion.base import FusionOutput
from mmptm.models.resources import build_objective
from mmptm.objectives.vqa import VQAHead, normalize_answer, soft_score, soft_targets
from mmptm.registry import OBJECTIVES

WIDTH = 16


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("Two.", "2"),  # period stripped, number word → digit
        ("the dog", "dog"),  # article dropped
        ("dont", "don't"),  # contraction restored
        ("yes!", "yes"),  # "!" becomes a space, then split/joined away
        ("  Yes \n", "yes"),
        ("A Red Car", "red car"),
        ("black-and-white", "black and white"),  # "-" not next to a space: a space
        ("yes, it is", "yes it is"),  # ", " is next to a space: deleted
        ("1,000", "1000"),  # digit,digit: every punctuation mark deleted
        ("2.5", "2.5"),  # a period before a digit stays
        ("none", "0"),
        ("ten", "10"),
        ("isnt it", "isn't it"),
    ],
)
def test_normalize_answer(raw: str, want: str) -> None:
    assert normalize_answer(raw) == want


def _leave_one_out(answers: list[str], cand: str) -> float:
    """The definition, literally: mean over the 10 subsets of 9 of min(1, matches/3)."""
    gts = [normalize_answer(a) for a in answers]
    c = normalize_answer(cand)
    subsets = [gts[:i] + gts[i + 1 :] for i in range(len(gts))]
    return sum(min(1.0, sum(g == c for g in s) / 3) for s in subsets) / len(subsets)


def test_soft_score_hand_worked() -> None:
    # 3 "yes" of 10: dropping a "yes" (3 of the 10 subsets) leaves 2 matches → 2/3; the other
    # 7 subsets keep 3 → 1. Mean = (3·2/3 + 7·1)/10 = 0.9.
    answers = ["yes"] * 3 + ["no"] * 7
    assert soft_score(answers, "yes") == pytest.approx(0.9)
    # 7 "no": every subset keeps >= 6 matches → 1.
    assert soft_score(answers, "no") == pytest.approx(1.0)
    # 1 match: dropping it (1 subset) → 0, the other 9 → 1/3: 9·(1/3)/10 = 0.3
    assert soft_score(["cat"] + ["dog"] * 9, "cat") == pytest.approx(0.3)
    # 2 matches: 2 subsets → 1/3, 8 subsets → 2/3: (2/3 + 16/3)/10 = 0.6
    assert soft_score(["cat"] * 2 + ["dog"] * 8, "Cat.") == pytest.approx(0.6)
    # 4 matches: every subset keeps >= 3 → 1
    assert soft_score(["cat"] * 4 + ["dog"] * 6, "the cat") == pytest.approx(1.0)
    assert soft_score(answers, "maybe") == 0.0


def test_soft_score_equals_literal_leave_one_out() -> None:
    pool = ["yes", "Yes.", "no", "2", "two", "a dog", "dog", "cat"]
    rng = np.random.default_rng(0)
    for _ in range(200):
        answers = [pool[i] for i in rng.integers(0, len(pool), 10)]
        for cand in ("yes", "2", "dog", "cat", "bird"):
            assert soft_score(answers, cand) == pytest.approx(_leave_one_out(answers, cand))


def test_soft_targets() -> None:
    vocab = ["yes", "no", "2", "unused"]
    answers = ["Yes"] * 3 + ["no"] * 6 + ["two"]
    got = soft_targets(answers, vocab)
    assert got.keys() == {0, 1, 2}
    assert got[0] == pytest.approx(0.9)
    assert got[1] == pytest.approx(1.0)
    assert got[2] == pytest.approx(0.3)
    assert soft_targets(answers, {"no": 7}) == {7: pytest.approx(1.0)}


# ---------------------------------------------------------------------------------------------
# Head


def _head(tmp_path, **cfg) -> VQAHead:
    path = tmp_path / "answers.txt"
    write_answer_vocab(["yes", "no", "2", "red", "dog"], path)
    torch.manual_seed(0)
    return build_objective(VQAHead.Config(answers=str(path), **cfg), width=WIDTH)


def test_vqa_head_loss_score_and_predict(tmp_path) -> None:
    assert OBJECTIVES.get("vqa") is VQAHead
    head = _head(tmp_path)
    assert head.num_answers == 5
    g = torch.Generator().manual_seed(0)
    pooled = torch.randn(4, WIDTH, generator=g)
    out = FusionOutput(hidden={}, mask={}, pooled={"joint": pooled})
    targets = torch.zeros(4, 5)
    targets[0, 0], targets[1, 1], targets[1, 2], targets[3, 4] = 1.0, 0.9, 0.3, 0.6
    res = head(out, {"vqa_targets": targets})

    with torch.no_grad():
        x = head.head(pooled).double().numpy()
    t = targets.double().numpy()
    # BCE with logits, elementwise: max(x,0) - x·t + log(1 + exp(-|x|)); summed over the 5
    # answers, averaged over the 4 questions (= mean over all × A)
    bce = np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x)))
    assert res["loss"].item() == pytest.approx(bce.sum(1).mean(), rel=1e-5)
    best = x.argmax(1)
    assert res["score"].item() == pytest.approx(t[np.arange(4), best].mean())
    assert torch.equal(head.predict(out), torch.from_numpy(best))
    assert head.answer_strings(torch.tensor([0, 3])) == ["yes", "red"]
    assert head(out, {}) == {}  # a batch without VQA targets sits it out


def test_vqa_head_config_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="answer vocabulary"):
        VQAHead(VQAHead.Config(), width=WIDTH)
    with pytest.raises(ValueError, match="num_answers=3"):
        _head(tmp_path, num_answers=3)
    with pytest.raises(FileNotFoundError):
        build_objective(VQAHead.Config(answers=str(tmp_path / "missing.txt")), width=WIDTH)
    with pytest.raises(ValueError, match="read by mmptm.models"):  # objectives read no files
        VQAHead(VQAHead.Config(answers=str(tmp_path / "missing.txt")), width=WIDTH)
    head = VQAHead(VQAHead.Config(num_answers=7, hidden_mult=3), width=WIDTH)
    assert head.head[0].out_features == 3 * WIDTH and head.head[-1].out_features == 7
    out = FusionOutput(hidden={}, mask={}, pooled={"text": torch.zeros(1, WIDTH)})
    with pytest.raises(ValueError, match="pooled"):
        head.predict(out)


def test_vqa_data_side_turns_raw_answers_into_soft_targets():
    from mmptm.objectives.vqa import SoftTargets

    t = SoftTargets(("yes", "no", "2"))
    batch = {"answers": [["yes"] * 3 + ["no"] * 7, ["two"] * 10, []]}
    out = t(batch, torch.Generator())["vqa_targets"]
    # Hand-worked: 3 "yes" of 10 → 0.9 (see above); 7 "no" → 1.0; "two" normalises to "2".
    torch.testing.assert_close(
        out, torch.tensor([[0.9, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    )
    assert t({"x": 1}, torch.Generator()) == {"x": 1}  # no answers: left alone


def test_vqa_data_side_is_handed_the_answer_file(tmp_path):
    from mmptm.encoders.base import VocabInfo
    from mmptm.models.resources import objective_data_transform
    from mmptm.objectives.vqa import SoftTargets

    write_answer_vocab(["yes", "no", "2"], tmp_path / "answers.txt")
    vocab = VocabInfo(vocab_size=8)
    cfg = VQAHead.Config(answers=str(tmp_path / "answers.txt"))
    assert objective_data_transform(cfg, vocab) == SoftTargets(("yes", "no", "2"))
    assert objective_data_transform(VQAHead.Config(num_answers=3), vocab) is None
    with pytest.raises(ValueError, match="needs the answers"):  # objectives read no files
        VQAHead.data_transform(cfg, vocab)


# ---------------------------------------------------------------------------------------------
# Answers scored against knowledge-graph entity vectors


def _entity_head(tmp_path, knowledge: bool = True):
    from mmptm.config import from_dict
    from mmptm.fusion.ernie import ErnieFusion

    tree = {
        "type": "ernie", "transformer": {"layers": 1, "heads": 2}, "knowledge_layers": 1,
        "entity_dim": 4, "entity_heads": 2, "entities": {"num_entities": 5, "dim": 4},
        "entity_views": {}, "knowledge": knowledge,
    }  # fmt: skip
    torch.manual_seed(0)
    fusion = ErnieFusion(from_dict(ErnieFusion.Config, tree), width=WIDTH)
    fusion.entities.names = ["T0", "M01", "M02", "M03", "P04"]  # as a loaded table has
    (tmp_path / "aliases.txt").write_text(
        "M01\tPlastic\nM02\twood\tWooden\nM03\tglass\nP04\tglass\tElena\nX99\twool\n"
    )
    write_answer_vocab(["plastic", "wooden", "glass", "elena", "wool", "yes"],
                       tmp_path / "answers.txt")  # fmt: skip
    cfg = VQAHead.Config(answers=str(tmp_path / "answers.txt"),
                         answer_entities=str(tmp_path / "aliases.txt"))  # fmt: skip
    return fusion, build_objective(cfg, width=WIDTH, fusion=fusion)


def test_answer_entities_map_aliases_to_table_rows(tmp_path) -> None:
    _, head = _entity_head(tmp_path)
    # by hand: "plastic" → M01 (row 1, case normalised), "wooden" → M02 (its second alias),
    # "glass" names M03 and P04 → neither, "elena" → P04 (row 4), "wool": X99 is not in the
    # table, "yes": no entity
    assert head.answer_rows.tolist() == [1, 2, -1, 4, -1, -1]


def test_answer_entity_term_is_the_dot_with_the_answer_entity_vector(tmp_path) -> None:
    fusion, head = _entity_head(tmp_path)
    g = torch.Generator().manual_seed(3)
    pooled = torch.randn(3, WIDTH, generator=g)
    out = FusionOutput(hidden={}, mask={}, pooled={"joint": pooled})
    E = fusion.entities.table.weight.detach().double()
    with torch.no_grad():
        hidden = head.head[:-1](pooled).double()
        plain = head.head[-1](hidden.float()).double()
        bias = head.head[-1].bias.double()
        W = head.to_entity.weight.detach().double()  # [K, H]
    got = head.logits(out).double()
    for b in range(3):
        for a, row in enumerate([1, 2, -1, 4, -1, -1]):
            if row >= 0:  # an entity answer: its bias + <W h, e>, no classifier row
                want = bias[a] + sum(W[k] @ hidden[b] * E[row, k] for k in range(4))
            else:
                want = plain[b, a]
            assert got[b, a].item() == pytest.approx(float(want), abs=1e-5)
    targets = torch.zeros(3, 6)
    targets[0, 0] = 1.0
    head(out, {"vqa_targets": targets})["loss"].backward()
    assert head.to_entity.weight.grad.abs().sum() > 0
    assert fusion.entities.table.weight.grad is None  # the graph's vectors stay frozen

    # without the graph (knowledge: false) the entity term is off, as dEA is
    fusion.cfg.knowledge = False
    torch.testing.assert_close(head.logits(out), head.head(pooled).float())


def test_answer_entities_errors(tmp_path) -> None:
    (tmp_path / "answers.txt").write_text("yes\nno\n")
    (tmp_path / "aliases.txt").write_text("M01\tplastic\n")
    cfg = VQAHead.Config(answers=str(tmp_path / "answers.txt"),
                         answer_entities=str(tmp_path / "aliases.txt"))  # fmt: skip
    with pytest.raises(ValueError, match="has none"):
        build_objective(cfg, width=WIDTH, fusion=torch.nn.Identity())
    (tmp_path / "table").mkdir()
    fusion, _ = _entity_head(tmp_path / "table")
    with pytest.raises(ValueError, match="none of the 2 answers"):
        build_objective(cfg, width=WIDTH, fusion=fusion)
