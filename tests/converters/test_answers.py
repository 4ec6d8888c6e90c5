"""VQA answer vocabularies: counted per question, ordered, written and read back; the answers
of VQA shards."""

from __future__ import annotations

from mmptm.converters.answers import (
    build_answer_vocab,
    read_answer_vocab,
    shard_answers,
    write_answer_vocab,
)
from mmptm.data.shards import ShardWriter


def test_build_answer_vocab_counts_questions_and_orders() -> None:
    lists = (
        [["yes"] * 10] * 3  # "yes" in 3 questions (30 answers)
        + [["no"] * 9 + ["Yes"]] * 2  # "no" in 2; "yes" in 2 more → 5
        + [["two", "2"]] * 2  # "2" in 2 (once per question)
        + [["blue"], ["red"]]
    )
    assert build_answer_vocab(lists, min_count=1) == ["yes", "2", "no", "blue", "red"]
    assert build_answer_vocab(lists, min_count=2) == ["yes", "2", "no"]
    assert build_answer_vocab(lists, min_count=1, top_k=2) == ["yes", "2"]
    assert build_answer_vocab(lists) == []  # default min_count=9


def test_answer_vocab_round_trip(tmp_path) -> None:
    vocab_path = tmp_path / "answers.txt"
    write_answer_vocab(["yes", "no", "black and white"], vocab_path)
    assert read_answer_vocab(vocab_path) == ["yes", "no", "black and white"]


def test_shard_answers_reads_every_question_and_skips_corrupt_json(tmp_path):
    with ShardWriter(str(tmp_path / "q-%06d.tar"), max_count=2) as w:
        w.write({"__key__": "a", "json": {"question": "q", "answers": ["yes", "Yes", "no"]}})
        w.write({"__key__": "b", "json": b"{not json"})
        w.write({"__key__": "c", "json": {"question": "test split: no answers"}})
        w.write({"__key__": "d", "txt": "no json member"})
    lists = shard_answers([str(tmp_path / "q-*.tar")])
    assert lists == [["yes", "Yes", "no"], []]
