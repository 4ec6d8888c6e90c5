"""mmptm data squad: samples, answer spans, skips, one-line errors."""

from __future__ import annotations

import json

import pytest
from conftest import cli_error, read_shard_samples

from mmptm.converters.qa import convert_squad

CONTEXT = "Anna owns Kato. Kato is made of wood. Anna lives in Oslo."
SQUAD = {"version": "1.1", "data": [{"title": "Toys", "paragraphs": [{"context": CONTEXT, "qas": [
    {"id": "a.1", "question": "Who owns Kato?", "answers": [
        {"text": "Anna", "answer_start": 0}, {"text": "Anna", "answer_start": 38}]},
    # answer_start off by two: the nearest occurrence is used
    {"id": "a.2", "question": "What is Kato made of?",
     "answers": [{"text": "wood", "answer_start": 30}, {"text": "oak", "answer_start": 3}]},
    {"id": "a.3", "question": "Where?", "answers": [], "is_impossible": True},
    {"id": "a.1", "question": "Who owns Kato, again?", "answers": [
        {"text": "Anna", "answer_start": 0}]},
]}]}]}  # fmt: skip


def _jsons(out, pattern):
    rows = read_shard_samples(sorted(str(p) for p in out.glob(pattern)))
    return [(key, json.loads(m["json"])) for key, m in rows]


def test_squad_samples_spans_and_counts(tmp_path):
    f = tmp_path / "dev-v1.1.json"
    f.write_text(json.dumps(SQUAD))
    stats = convert_squad(f, tmp_path / "out", language="en")
    assert stats["written"] == 3 and stats["split"] == "dev"
    assert stats["skipped"] == {"unanswerable": 1}
    assert stats["moved_answers"] == 1 and stats["answers_not_in_context"] == 1
    (k1, j1), (k2, j2), (k3, j3) = _jsons(tmp_path / "out", "dev-en-*.tar")
    assert (k1, k2, k3) == ("a_1", "a_2", "a_1_1")  # no '.' in keys, repeated ids apart
    assert j1["premise"] == "Who owns Kato?" and j1["hypothesis"] == CONTEXT
    ((s, e, _),) = j1["answer"]["hypothesis"]  # the first gold answer alone
    assert CONTEXT[s:e] == "Anna" and s == 0
    assert [a["text"] for a in j1["answers"]] == ["Anna", "Anna"] and j1["id"] == "a.1"
    ((s, e, _),) = j2["answer"]["hypothesis"]
    assert CONTEXT[s:e] == "wood" and s == CONTEXT.index("wood")
    assert [a["text"] for a in j2["answers"]] == ["wood", "oak"]  # scored against both
    assert j2["context_span"] == {"hypothesis": [[0, len(CONTEXT), 0]]}
    assert j2["title"] == "Toys" and j2["language"] == "en"
    assert j3["premise"] == "Who owns Kato, again?"


@pytest.mark.parametrize(
    "doc, where",
    [
        ({"data": {}}, "'data' must be a list"),
        ({"data": [{"paragraphs": [{"qas": []}]}]}, "data[0].paragraphs[0]: 'context'"),
        ({"data": [{"paragraphs": [{"context": "x", "qas": [{"id": "1", "question": "q",
          "answers": [{"text": "x"}]}]}]}]}, "qas[0].answers[0]: 'answer_start' must be"),
        ({"data": [{"paragraphs": [{"context": "x", "qas": [{"question": "q"}]}]}]},
         "qas[0]: needs a non-empty 'question' and an 'id'"),
    ],
)  # fmt: skip
def test_a_malformed_entry_is_one_line_naming_it(tmp_path, capsys, doc, where):
    f = tmp_path / "train.json"
    f.write_text(json.dumps(doc))
    line = cli_error(capsys, ["data", "squad", "--input", str(f), "--out", str(tmp_path / "o"),
                              "--lang", "en"])  # fmt: skip
    assert str(f) in line and where in line
    f.write_text("{not json")
    assert "not JSON" in cli_error(capsys, ["data", "squad", "--input", str(f), "--out",
                                            str(tmp_path / "o"), "--lang", "en"])  # fmt: skip
