"""`mmptm data link`: longest match, word boundaries, case policy, scripts, ambiguity, shards
copied byte for byte, and mentions reaching the tokens through the tokenizer's offsets."""

import itertools
import json

import pytest
from conftest import cli_error, read_shard_samples

from mmptm.converters.linking import AliasDictionary, link_shards, read_dictionaries
from mmptm.data.shards import ShardWriter
from mmptm.modalities.base import DataContext
from mmptm.modalities.text import TextData


def found(d: AliasDictionary, text: str) -> list[tuple[str, str]]:
    """(the text each mention covers, its entity); the offsets are checked by slicing."""
    mentions, _ = d.link(text)
    assert all(0 <= s < e <= len(text) for s, e, _ in mentions)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(mentions))  # ordered, no overlap
    return [(text[s:e], entity) for s, e, entity in mentions]


def test_longest_match_wins_and_mentions_never_overlap():
    d = AliasDictionary.build(
        {"NY": ["New York"], "NYC": ["New York City"], "YC": ["York City"], "C": ["City Hall"]}
    )
    text = "From New York City Hall to New York, then York City."
    assert found(d, text) == [
        ("New York City", "NYC"),  # not "New York", and "City Hall" overlaps it: not found
        ("New York", "NY"),
        ("York City", "YC"),
    ]


def test_never_inside_a_word():
    d = AliasDictionary.build({"Q1": ["Bimo"], "Q2": ["red"]})
    text = "Bimodal Bimo, (Bimo) Bimo's Bimos bimo-like reddish 2Bimo"
    assert found(d, text) == [("Bimo", "Q1"), ("Bimo", "Q1"), ("Bimo", "Q1"), ("bimo", "Q1")]
    assert found(d, "Bimodal") == []


def test_case_policy():
    aliases = {"US": ["US"], "us": ["us"], "ice": ["ice"], "NASA": ["NASA"], "Bimo": ["Bimo"]}
    auto = AliasDictionary.build(aliases, "auto")
    text = "us US Us ICE ice Nasa NASA bimo BIMO"
    assert found(auto, text) == [
        ("us", "us"), ("US", "US"), ("ice", "ice"), ("NASA", "NASA"),
        ("bimo", "Bimo"), ("BIMO", "Bimo"),
    ]  # fmt: skip
    sensitive = AliasDictionary.build(aliases, "sensitive")
    assert [m for m, _ in found(sensitive, text)] == ["us", "US", "ice", "NASA"]
    insensitive = AliasDictionary.build({"US": ["US"], "Bimo": ["Bimo"]}, "insensitive")
    assert found(insensitive, "us Us bimo") == [("us", "US"), ("Us", "US"), ("bimo", "Bimo")]


def test_cyrillic_cjk_and_offsets_after_characters_that_fold_to_two():
    d = AliasDictionary.build({"Q649": ["Москва"], "Q1490": ["東京"], "Q5": ["Bimo"]})
    assert found(d, "В МОСКВА, не в Москве; москва.") == [("МОСКВА", "Q649"), ("москва", "Q649")]
    assert found(d, "東京都に住む") == [("東京", "Q1490")]  # CJK: each ideograph is a word
    # "ß" and "İ" fold to two characters; the mention after them keeps its offsets
    assert found(d, "Straße İİ BIMO") == [("BIMO", "Q5")]


def test_ambiguity_policy_and_counts(tmp_path):
    (tmp_path / "aliases.txt").write_text(
        "Q1\tParis\nQ2\tParis\tParis, France\tCity of Light\nQ3\tParis\tParis Hilton\n"
    )
    # no graph: the entity with the most aliases; a tie would go to the first in the file
    d = read_dictionaries([str(tmp_path / "aliases.txt")])["*"]
    assert found(d, "Paris") == [("Paris", "Q2")]
    assert d.link("Paris and paris but Paris Hilton") == (
        [[0, 5, "Q2"], [10, 15, "Q2"], [20, 32, "Q3"]], 2  # two mentions used "paris"
    )  # fmt: skip
    assert d.ambiguous == {"paris"}
    # with a graph: the entity with the most triples
    (tmp_path / "triples.txt").write_text("Q3\tr\tQ1\nQ3\tr\tQ2\nQ1\tr\tQ3\n")
    d = read_dictionaries([str(tmp_path / "aliases.txt")], triples=tmp_path / "triples.txt")
    assert found(d["*"], "Paris") == [("Paris", "Q3")]
    # an entity vocabulary drops the aliases of entities it lacks, counted
    (tmp_path / "entities.txt").write_text("Q1\n")
    d = read_dictionaries([str(tmp_path / "aliases.txt")], entities=tmp_path / "entities.txt")
    assert found(d["*"], "Paris Hilton") == [("Paris", "Q1")]
    assert d["*"].unknown_entities == 2 and not d["*"].ambiguous


def _write_shards(folder):
    samples = [
        {"__key__": "a", "jpg": b"\xff\xd8 not really a jpeg \x00\x01",
         "json": {"captions": {"en": "Bimo is red.", "ru": "Бимо красный."}, "x": [1, 2]}},
        {"__key__": "b", "txt": "I saw Bimo.", "json": {"language": "en"}},
        {"__key__": "c", "jpg": b"no text at all", "json": {"other": 1}},
        {"__key__": "d", "json": {"captions": {"en": ["Bimo", "no toy", "BIMO!"]}}},
        {"__key__": "e", "txt": "Bimo alone, no json"},
        {"__key__": "f", "txt": "Bimo", "json": b"{not json"},
    ]  # fmt: skip
    with ShardWriter(str(folder / "train-%06d.tar"), 4) as w:
        for s in samples:
            w.write(s)
    return w.shards


def test_shards_are_copied_byte_for_byte_except_json(tmp_path):
    shards = _write_shards(tmp_path / "in")
    (tmp_path / "en.txt").write_text("Q5\tBimo\n")
    (tmp_path / "ru.txt").write_text("Q5\tБимо\n")
    dicts = read_dictionaries([f"en={tmp_path / 'en.txt'}", f"ru={tmp_path / 'ru.txt'}"])
    stats = link_shards(str(tmp_path / "in"), tmp_path / "out", dicts, progress=False)
    before = read_shard_samples(shards)
    after = read_shard_samples(sorted(str(p) for p in (tmp_path / "out").glob("*.tar")))
    assert [p.name for p in (tmp_path / "out").glob("*.tar")] == [
        "train-000000.tar", "train-000001.tar"]  # fmt: skip
    assert [k for k, _ in after] == [k for k, _ in before]
    metas = {}
    for (key, old), (_, new) in zip(before, after):
        added = ["json"] if "json" not in old and key == "e" else []
        assert list(new) == [*old, *added]  # same members, same order
        for ext in old:
            if ext != "json" or key in ("c", "f"):  # no text / unreadable json: untouched
                assert new[ext] == old[ext], (key, ext)
        metas[key] = json.loads(new["json"]) if key != "f" else None
        if "json" in old and key not in ("c", "f"):  # every other field kept
            assert {k: v for k, v in metas[key].items() if k != "mentions"} == json.loads(
                old["json"])  # fmt: skip
    assert metas["a"]["mentions"] == {"en": [[0, 4, "Q5"]], "ru": [[0, 4, "Q5"]]}
    assert metas["b"]["mentions"] == [[6, 10, "Q5"]]
    assert metas["d"]["mentions"] == {"en": [[[0, 4, "Q5"]], [], [[0, 4, "Q5"]]]}
    # a txt without json.language: the language-independent dictionary, and there is none
    assert metas["e"] == {}
    summary = stats.summary()
    assert (summary["samples"], summary["mentions"], summary["no_text"], summary["bad"]) == (
        6, 5, 1, 1)  # fmt: skip
    assert summary["per_language"] == {"en": 4, "ru": 1} and summary["other_language"] == 1


def test_languages_option_and_cli(tmp_path, capsys):
    from mmptm.cli import main

    _write_shards(tmp_path / "in")
    (tmp_path / "all.txt").write_text("Q5\tBimo\tБимо\n")
    argv = ["data", "link", "--input", str(tmp_path / "in" / "train-*.tar"), "--aliases",
            str(tmp_path / "all.txt"), "--out", str(tmp_path / "out"), "--languages", "ru",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((tmp_path / "out" / "link.json").read_text())
    assert summary["per_language"] == {"ru": 1} and summary["mentions"] == 1
    (_, members), *_ = read_shard_samples([str(tmp_path / "out" / "train-000000.tar")])
    assert json.loads(members["json"])["mentions"] == {"ru": [[0, 4, "Q5"]]}


@pytest.mark.parametrize(
    ("content", "match"),
    [("Q1\tBimo\nQ2\n", "bad.txt:2: expected 'id<TAB>alias"), ("Q1\tBimo\n\t\tx\n", "bad.txt:2")],
)
def test_malformed_alias_lines_name_file_and_line(tmp_path, capsys, content, match):
    (tmp_path / "bad.txt").write_text(content)
    _write_shards(tmp_path / "in")
    argv = ["data", "link", "--input", str(tmp_path / "in"), "--aliases",
            str(tmp_path / "bad.txt"), "--out", str(tmp_path / "out")]  # fmt: skip
    line = cli_error(capsys, argv)
    assert match in line


def test_mentions_reach_the_first_piece_through_the_offsets(tmp_path, tiny_tokenizer):
    """The linker's output read by the text plug-in: each mention's id string becomes its
    row in the entity vocabulary at the piece whose offsets start the mention."""
    tok = tiny_tokenizer
    (tmp_path / "aliases.txt").write_text("Q7\tblue triangle\nQ9\tcircle\nQ404\tsmall\n")
    (tmp_path / "entities.txt").write_text("Q1\nQ9\nQ7\n")  # rows: Q9 → 1, Q7 → 2; no Q404
    d = read_dictionaries([str(tmp_path / "aliases.txt")])["*"]
    text = "A large blue triangle is below a small red circle."
    mentions, _ = d.link(text)
    text_data = TextData(
        TextData.Config(spans={"entity": "mentions"},
                        span_vocabularies={"entity": str(tmp_path / "entities.txt")}),
        views=["text"], context=DataContext(tokenizer=tok),
    )  # fmt: skip
    out = text_data.decode({}, {"captions": {"en": text}, "mentions": {"en": mentions}}, None)
    # Independently of the plug-in: the piece whose text begins where the mention begins
    # ([CLS] is token 0, so piece t is token t + 1); sentencepiece marks a word start "▁".
    expected = [-1] * len(out["input_ids"])
    pieces = [tok.id_to_piece(i) for i in tok.encode(text)]
    starts, pos = [], 0
    for piece in pieces:
        surface = piece.replace("\u2581", " ")
        if text[pos : pos + 1] == " ":  # the first piece's "▁" stands for no character
            pos += len(surface) - len(surface.lstrip())
        starts.append(pos)
        pos += len(surface.lstrip())
    assert pos == len(text)
    for alias, row in [("blue triangle", 2), ("circle", 1)]:
        expected[starts.index(text.index(alias)) + 1] = row
    assert out["entity_ids"] == expected
    assert text_data.unknown_ids == {"entity": 1}  # "small" → Q404, not in the vocabulary
