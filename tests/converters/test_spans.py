"""mmptm data typing / relations: spans survive detokenisation, vocabularies, errors."""

from __future__ import annotations

import json

import pytest
from conftest import cli_error, read_shard_samples

from mmptm.converters.spans import convert_spans, detokenize

OPEN_ENTITY = [
    {"left_context_token": ["In", "1990", ",", "the"], "mention_span": "toy maker",
     "right_context_token": ["-LRB-", "Bimo", "-RRB-", "moved", "."],
     "y_str": ["organization", "company"], "entity": "T000", "facts": "graph"},
    {"left_context_token": [], "mention_span": "Anna",
     "right_context_token": ["does", "n't", "own", "Kato", "'s", "box", "."],
     "y_str": ["person"], "facts": "text"},
]  # fmt: skip
TACRED = [
    {"id": "r1", "token": ["Bimo", "is", "made", "of", "fine", "wood", "."],
     "subj_start": 0, "subj_end": 0, "obj_start": 4, "obj_end": 5, "relation": "made_of",
     "subj_id": "T000", "obj_id": "M_wood", "facts": "text"},
    {"id": "r2", "token": ["Kato", "sat", "near", "Anna", "."], "subj_start": 0,
     "subj_end": 0, "obj_start": 3, "obj_end": 3, "relation": "no_relation"},
]  # fmt: skip
FEWREL = {"P127": [{"tokens": ["Anna", "owns", "Kato", "."],
                    "h": ["kato", "T001", [[2]]], "t": ["anna", "P_anna", [[0]]]}]}  # fmt: skip


def _write_lines(path, items):
    path.write_text("".join(json.dumps(x) + "\n" for x in items))
    return path


def _samples(out, split):
    rows = read_shard_samples(sorted(str(p) for p in out.glob(f"{split}-*.tar")))
    return [(m["txt"].decode(), json.loads(m["json"])) for _, m in rows]


def test_detokenize_offsets_cover_each_token():
    toks = ["He", "said", "-LRB-", "hi", "-RRB-", ",", "did", "n't", "he", "?"]
    text, spans = detokenize(toks)
    assert text == "He said (hi), didn't he?"
    for tok, (a, b) in zip(toks, spans):
        assert text[a:b] == {"-LRB-": "(", "-RRB-": ")"}.get(tok, tok)


def test_typing_round_trip_spans_labels_entities(tmp_path):
    train = _write_lines(tmp_path / "train.json", OPEN_ENTITY)
    stats = convert_spans("typing", train, tmp_path / "out")
    assert stats["written"] == 2 and stats["split"] == "train"
    assert (tmp_path / "out" / "labels.txt").read_text().split() == [
        "company", "organization", "person"]  # fmt: skip
    (t0, j0), (t1, j1) = _samples(tmp_path / "out", "train")
    assert t0 == "In 1990, the toy maker (Bimo) moved."
    ((s, e, _),) = j0["mention"]
    assert t0[s:e] == "toy maker" and j0["labels"] == ["organization", "company"]
    assert j0["mentions"] == [[s, e, "T000"]] and j0["facts"] == "graph"
    ((s, e, _),) = j1["mention"]
    assert t1[s:e] == "Anna" and "mentions" not in j1 and t1 == "Anna doesn't own Kato's box."
    # dev: labels counted against the train vocabulary
    dev = _write_lines(tmp_path / "dev.json", [{**OPEN_ENTITY[1], "y_str": ["place"]}])
    assert convert_spans("typing", dev, tmp_path / "out")["unknown_labels"] == 1


def test_tacred_and_fewrel_round_trip(tmp_path):
    f = tmp_path / "train.json"
    f.write_text(json.dumps(TACRED))
    convert_spans("relations", f, tmp_path / "out")
    (t0, j0), (t1, j1) = _samples(tmp_path / "out", "train")
    assert t0[slice(*j0["subj"][0][:2])] == "Bimo" and t0[slice(*j0["obj"][0][:2])] == "fine wood"
    assert [m[2] for m in j0["mentions"]] == ["T000", "M_wood"] and j0["id"] == "r1"
    assert j0["labels"] == ["made_of"] and j1["labels"] == ["no_relation"]
    assert t1[slice(*j1["obj"][0][:2])] == "Anna" and "mentions" not in j1
    g = tmp_path / "few.json"
    g.write_text(json.dumps(FEWREL))
    convert_spans("relations", g, tmp_path / "few", split="val")
    ((t, j),) = _samples(tmp_path / "few", "val")
    assert t[slice(*j["subj"][0][:2])] == "Kato" and t[slice(*j["obj"][0][:2])] == "Anna"
    assert j["labels"] == ["P127"] and j["mentions"][0][2] == "T001"


@pytest.mark.parametrize(
    ("task", "items", "needle"),
    [
        ("typing", [OPEN_ENTITY[0], {**OPEN_ENTITY[1], "y_str": "person"}], "item 1: 'y_str'"),
        ("typing", [{**OPEN_ENTITY[0], "mention_span": ""}], "item 0: 'mention_span'"),
        ("relations", [TACRED[0], {**TACRED[1], "obj_end": 9}], "item 1: object tokens 3..9"),
        ("relations", [{**TACRED[0], "relation": None}], "item 0: 'relation'"),
    ],
)
def test_malformed_items_name_file_and_index(tmp_path, capsys, task, items, needle):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(items))
    msg = cli_error(capsys, ["data", task, "--input", str(f), "--out", str(tmp_path / "o")])
    assert "bad.json" in msg and needle in msg
    assert not list((tmp_path / "o").glob("*.tar"))  # checked before anything is written
