"""The extractive_qa head: windows (BERT's doc stride), rows against the tokenised text,
targets, and the best span against brute force."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from mmptm.encoders.base import VocabInfo
from mmptm.modalities.base import DataContext
from mmptm.modalities.text import TextData
from mmptm.objectives.qa import ExtractiveQA, windows
from mmptm.tokenizers.sentencepiece import train_tokenizer

CONTEXT = "Bimo is made of wood . Kato belongs to Anna . Lumi is made of felt . Zepp is tin ."
QUESTIONS = [("Who owns Kato ?", "Anna"), ("What is Zepp made of ?", "tin"),
             ("Bimo ?", "Bimo is made of wood")]  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    corpus = root / "corpus.txt"
    corpus.write_text((CONTEXT + "\n" + " ".join(q for q, _ in QUESTIONS) + "\n") * 20)
    return train_tokenizer([corpus], root / "tok", vocab_size=50, model_type="bpe",
                           seed=0, num_threads=1)  # fmt: skip


def test_windows_by_hand():
    assert windows(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert windows(5, 4, 8) == [(0, 4), (4, 1)]  # a stride past the window: no overlap
    assert windows(3, 4, 2) == [(0, 3)] and windows(0, 4, 2) == [(0, 0)]


def test_windows_cover_every_piece_and_end_at_the_end():
    rng = random.Random(0)
    for _ in range(200):
        n, size, stride = rng.randint(0, 40), rng.randint(1, 9), rng.randint(1, 12)
        ws = windows(n, size, stride)
        covered = {i for s, k in ws for i in range(s, s + k)}
        assert covered == set(range(n)) and ws[-1][0] + ws[-1][1] == n
        assert all(0 < k <= size for _, k in ws) or n == 0
        assert all(b[0] - a[0] == min(stride, a[1]) for a, b in itertools.pairwise(ws))


def _meta(question: str, answer: str) -> dict:
    start = CONTEXT.index(answer)
    return {"premise": question, "hypothesis": CONTEXT, "language": "en",
            "answer": {"hypothesis": [[start, start + len(answer), 0]]},
            "context_span": {"hypothesis": [[0, len(CONTEXT), 0]]}}  # fmt: skip


def _rows(tokenizer, head: ExtractiveQA, separators: int = 1) -> dict:
    """A batch of the three questions through the text plug-in, the head's windows and the
    pair joining, as the pipeline runs them."""
    cfg = TextData.Config(max_len=200, separators=separators, **head.data_needs()["text"].facts)
    plugin = TextData(cfg, views=["text"], context=DataContext(tokenizer=tokenizer))
    batch = plugin.collate([plugin.decode({}, _meta(q, a), None) for q, a in QUESTIONS])
    batch["__key__"] = ["q0", "q1", "q2"]
    stride = ExtractiveQA.data_transform(head.cfg, VocabInfo.from_tokenizer(tokenizer))
    for t in sorted([stride, *plugin.transforms()], key=lambda t: t.data_priority):
        batch = t(batch, torch.Generator())
    return batch


@pytest.mark.parametrize("separators", [1, 2])
def test_rows_are_question_and_window_of_the_tokenised_context(tokenizer, separators):
    head = ExtractiveQA(ExtractiveQA.Config(max_len=16, stride=5, max_query_len=5), width=8)
    batch = _rows(tokenizer, head, separators)
    ctx = tokenizer.encode(CONTEXT)
    cls, sep = tokenizer.cls_id, tokenizer.sep_id
    seen = {k: [] for k in ("q0", "q1", "q2")}
    for r, key in enumerate(batch["__key__"]):
        q = tokenizer.encode(QUESTIONS[int(key[1])][0])[:3]  # max_query_len 5: 3 pieces
        off, n = batch["qa_offset"][r].item(), batch["qa_length"][r].item()
        middle = [sep] if separators == 2 else []
        want = [cls, *q, sep, *middle, *ctx[off : off + n], sep]
        assert batch["input_ids"][r][batch["attention_mask"][r]].tolist() == want
        assert len(want) <= 16
        seen[key].append((off, n))
    for key, ws in seen.items():  # each question: the windows of the whole context
        nq = len(tokenizer.encode(QUESTIONS[int(key[1])][0])[:3]) + 2
        assert ws == windows(len(ctx), 16 - nq - 2, 5)


def test_targets_point_at_the_answer_only_where_a_window_holds_all_of_it(tokenizer):
    head = ExtractiveQA(ExtractiveQA.Config(max_len=16, stride=5, max_query_len=5), width=8)
    batch = _rows(tokenizer, head)
    _, offsets = tokenizer.encode_with_offsets(CONTEXT)
    start_R, end_R = head.targets(batch)
    for r, key in enumerate(batch["__key__"]):
        answer = QUESTIONS[int(key[1])][1]
        a, b = CONTEXT.index(answer), CONTEXT.index(answer) + len(answer)
        pieces = [i for i, (x, y) in enumerate(offsets) if x < y and x < b and y > a]
        off, n = batch["qa_offset"][r].item(), batch["qa_length"][r].item()
        inside = off <= pieces[0] and pieces[-1] < off + n
        assert batch["qa_complete"][r].item() == inside
        if not inside:
            assert start_R[r] == end_R[r] == 0
            continue
        first = int(batch["attention_mask"][r].sum()) - 1 - n  # the window's first position
        assert (start_R[r].item(), end_R[r].item()) == (first + pieces[0] - off,
                                                        first + pieces[-1] - off)  # fmt: skip
    assert batch["qa_complete"].any() and not batch["qa_complete"].all()


def test_best_span_equals_brute_force(tokenizer):
    head = ExtractiveQA(ExtractiveQA.Config(max_len=16, stride=5, max_query_len=5,
                                            max_answer_len=3), width=8)  # fmt: skip
    batch = _rows(tokenizer, head)
    R, L = batch["input_ids"].shape
    g = torch.Generator().manual_seed(0)
    start, end = torch.randn(R, L, generator=g), torch.randn(R, L, generator=g)
    score, first, last = head.best_spans(start, end, batch)
    for r in range(R):
        ctx = batch["qa_context_mask"][r].nonzero().flatten().tolist()
        pos0 = int(batch["attention_mask"][r].sum()) - 1 - batch["qa_length"][r].item()
        best = max((start[r, i] + end[r, j], i, j) for i in ctx for j in ctx if 0 <= j - i < 3)
        assert score[r].item() == pytest.approx(best[0].item())
        off = batch["qa_offset"][r].item()
        assert (first[r].item(), last[r].item()) == (off + best[1] - pos0, off + best[2] - pos0)


def test_loss_and_config_checks(tokenizer):
    head = ExtractiveQA(ExtractiveQA.Config(max_len=16, stride=5, max_query_len=5,
                                            dropout=0.0), width=8)  # fmt: skip
    batch = _rows(tokenizer, head)
    R, L = batch["input_ids"].shape
    out = type("Out", (), {"hidden": {"text": torch.randn(R, L, 8)}})()
    s, e = head.logits(out, batch)
    assert (s[~batch["attention_mask"]] < -1e3).all()  # padding never wins
    gs, ge = head.targets(batch)
    want = (torch.nn.functional.cross_entropy(s, gs) + torch.nn.functional.cross_entropy(e, ge)) / 2
    torch.testing.assert_close(head(out, batch)["loss"], want)
    with pytest.raises(ValueError, match="max_query_len=14"):
        ExtractiveQA(ExtractiveQA.Config(max_len=16, max_query_len=14), width=8)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        ExtractiveQA(ExtractiveQA.Config(stride=0), width=8)
