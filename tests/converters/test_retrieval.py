"""Tatoeba and BUCC converters: shards as the retrieval evaluations read them, and one-line
errors naming the file and line."""

from __future__ import annotations

import json

import pytest

from mmptm.converters.retrieval import convert_bucc, convert_tatoeba, tatoeba_pair
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.eval.bucc import read_bucc
from mmptm.eval.xlingual import read_pairs


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_tatoeba_pairs_become_parallel_shards(tmp_path):
    _write(tmp_path / "tatoeba.deu-eng.deu", ["Ich bin müde.", "Guten Morgen!"])
    _write(tmp_path / "tatoeba.deu-eng.eng", ["I am tired.", "Good morning!"])
    _write(tmp_path / "xx-en.xx", ["a", "b", "c"])  # XTREME's names; an unknown code stays
    _write(tmp_path / "xx-en.en", ["A", "B", "C"])
    (tmp_path / "README").write_text("not a Tatoeba file")
    stats = convert_tatoeba([tmp_path], tmp_path / "out")
    assert stats["written"] == {"de": 2, "xx": 3}
    pairs = read_pairs(str(tmp_path / "out" / "test-*.tar"), "en", 0)
    assert pairs["de"] == [("I am tired.", "Ich bin müde."), ("Good morning!", "Guten Morgen!")]
    assert [p[1] for p in pairs["xx"]] == ["a", "b", "c"]
    # either file of a pair names it
    a = tatoeba_pair(tmp_path / "tatoeba.deu-eng.eng")
    assert a == (tmp_path / "tatoeba.deu-eng.deu", tmp_path / "tatoeba.deu-eng.eng", "deu", "eng")


def test_tatoeba_errors_name_the_file_and_line(tmp_path):
    _write(tmp_path / "tatoeba.fra-eng.fra", ["un", "", "trois"])
    _write(tmp_path / "tatoeba.fra-eng.eng", ["one", "two", "three"])
    with pytest.raises(ValueError, match=r"tatoeba\.fra-eng\.fra:2: empty line"):
        convert_tatoeba([tmp_path / "tatoeba.fra-eng.fra"], tmp_path / "out")
    _write(tmp_path / "tatoeba.fra-eng.fra", ["un", "deux"])
    with pytest.raises(ValueError, match="line counts differ: .*has 2 lines, .*has 3"):
        convert_tatoeba([tmp_path / "tatoeba.fra-eng.fra"], tmp_path / "out")
    with pytest.raises(ValueError, match="not a Tatoeba file name"):
        convert_tatoeba([_write(tmp_path / "corpus.txt", ["x"])], tmp_path / "out")


def _bucc(tmp_path, src_lines, tgt_lines, gold_lines=None):
    _write(tmp_path / "de-en.sample.de", src_lines)
    _write(tmp_path / "de-en.sample.en", tgt_lines)
    if gold_lines is not None:
        _write(tmp_path / "de-en.sample.gold", gold_lines)
    return tmp_path / "de-en.sample"


def test_bucc_sentences_and_gold_pairs(tmp_path):
    prefix = _bucc(tmp_path, ["de-1\tHallo Welt", "de-2\tGuten Tag", "de-3\tHallo Welt"],
                   ["en-7\tHello world", "en-8\tGood day"],
                   ["de-1\ten-7", "de-3\ten-7", "de-2\ten-8"])  # fmt: skip
    stats = convert_bucc(prefix, tmp_path / "out")
    assert (stats["source"], stats["target"], stats["gold_pairs"]) == (3, 2, 3)
    assert stats["split"] == "sample"
    samples = list(tar_samples(expand_shards(",".join(stats["shards"])), SkipCounter()))
    meta = {json.loads(s["json"])["id"]: json.loads(s["json"]) for s in samples}
    assert meta["de-1"] == {"language": "de", "id": "de-1", "side": "source", "pair": ["de", "en"],
                            "gold": ["en-7"]}  # fmt: skip
    assert "gold" not in meta["en-8"] and meta["en-8"]["side"] == "target"
    (s,) = read_bucc(str(tmp_path / "out" / "sample-de-en-*.tar")).values()
    assert s.source == {"de-1": "Hallo Welt", "de-2": "Guten Tag", "de-3": "Hallo Welt"}
    assert s.target == {"en-7": "Hello world", "en-8": "Good day"}
    assert s.gold == {("de-1", "en-7"), ("de-3", "en-7"), ("de-2", "en-8")}
    # no gold file (BUCC's test split): no gold
    (tmp_path / "de-en.sample.gold").unlink()
    convert_bucc(prefix, tmp_path / "nogold", split="test")
    (s,) = read_bucc(str(tmp_path / "nogold" / "test-de-en-*.tar")).values()
    assert s.gold is None


@pytest.mark.parametrize(
    ("src", "tgt", "gold", "message"),
    [
        (["de-1\tA", "de-2 B"], ["en-1\tA"], None, r"sample\.de:2: expected 'id<TAB>sentence'"),
        (["de-1\tA", "de-1\tB"], ["en-1\tA"], None, r"de-en\.sample\.de:2: id 'de-1' again"),
        (["de-1\tA"], ["en-1\t"], None, r"de-en\.sample\.en:1: expected 'id<TAB>sentence'"),
        (["de-1\tA"], ["en-1\tA"], ["de-1\ten-1", "de-1"], r"de-en\.sample\.gold:2: expected"),
        (["de-1\tA"], ["en-1\tA"], ["de-1\ten-9"], r"sample\.gold:1: id 'en-9' is in no sentence"),
    ],
)  # fmt: skip
def test_bucc_errors_name_the_file_and_line(tmp_path, src, tgt, gold, message):
    prefix = _bucc(tmp_path, src, tgt, gold)
    with pytest.raises(ValueError, match=message):
        convert_bucc(prefix, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written


def test_cli_commands(tmp_path, capsys):
    from mmptm.cli import main

    _write(tmp_path / "tatoeba.spa-eng.spa", ["hola"])
    _write(tmp_path / "tatoeba.spa-eng.eng", ["hello"])
    assert main(["data", "tatoeba", "--input", str(tmp_path / "tatoeba.spa-eng.spa"),
                 "--out", str(tmp_path / "t")]) == 0  # fmt: skip
    assert (tmp_path / "t" / "test-es-en-000000.tar").is_file()
    prefix = _bucc(tmp_path, ["de-1\tA"], ["en-1\tA"], ["de-1\ten-1"])
    assert main(["data", "bucc", "--input", str(prefix), "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "sample-de-en-000000.tar").is_file()
    capsys.readouterr()
    _write(tmp_path / "de-en.sample.de", ["broken line"])
    assert main(["data", "bucc", "--input", str(prefix), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "de-en.sample.de:1: expected" in err.strip().splitlines()[-1]
