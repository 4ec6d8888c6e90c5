"""mmptm data conll / conllu: sentences, word and tag spans, vocabularies, one-line errors."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import cli_error, read_shard_samples

from mmptm.converters.tagging import (
    conll_sentences,
    conllu_sentences,
    convert_tagging,
    split_of,
)

WIKIANN = "en:Paris\tB-LOC\nen:is\tO\n\nen:Anna\tB-PER\nen:Karenina\tI-PER\nen:http://x\tO\n"
CONLL2003 = "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n"
CONLLU = """# newdoc id = d1
# sent_id = s1
# text = Don't go.
1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_
1\tDo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_
2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_
3\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
3.1\tgone\tgo\tVERB\tVBN\t_\t_\t_\t3:conj\t_
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_

# sent_id = withheld
1\t_\t_\tNOUN\t_\t_\t0\troot\t_\t_
2\t_\t_\tVERB\t_\t_\t1\tdep\t_\t_

1\tYes\tyes\tINTJ\tUH\t_\t0\troot\t_\t_
"""


def _samples(out, pattern):
    rows = read_shard_samples(sorted(str(p) for p in out.glob(pattern)))
    return [(m["txt"].decode(), json.loads(m["json"])) for _, m in rows]


def test_conll_reads_wikiann_and_conll2003(tmp_path):
    f = tmp_path / "en-train"
    f.write_text(WIKIANN)
    got = [(w, t) for _, w, t, _ in conll_sentences(f, "en")]
    assert got == [(["Paris", "is"], ["B-LOC", "O"]),
                   (["Anna", "Karenina", "http://x"], ["B-PER", "I-PER", "O"])]  # fmt: skip
    assert [line for line, *_ in conll_sentences(f, "en")] == [1, 4]
    # another language's prefix is a word as written
    assert next(conll_sentences(f, "de"))[1][0] == "en:Paris"
    g = tmp_path / "eng.train"
    g.write_text(CONLL2003)
    assert [(w, t) for _, w, t, _ in conll_sentences(g)] == [(["EU", "rejects"], ["B-ORG", "O"])]


def test_conllu_skips_ranges_empty_nodes_and_withheld_text(tmp_path):
    f = tmp_path / "en_ewt-ud-dev.conllu"
    f.write_text(CONLLU)
    skipped: Counter[str] = Counter()
    got = list(conllu_sentences(f, "upos", skipped))
    assert [(w, t, x) for _, w, t, x in got] == [
        (["Do", "n't", "go", "."], ["AUX", "PART", "VERB", "PUNCT"], {"id": "s1"}),
        (["Yes"], ["INTJ"], {}),
    ]
    assert skipped["no_text"] == 1
    assert next(t for _, _, t, _ in conllu_sentences(f, "xpos")) == ["VBP", "RB", "VB", "."]


def test_shards_spans_and_vocabulary(tmp_path):
    out = tmp_path / "out"
    f = tmp_path / "train.tsv"
    f.write_text(WIKIANN)
    stats = convert_tagging("conll", f, out, language="en")
    assert stats["written"] == 2 and stats["split"] == "train" and stats["words"] == 5
    assert (out / "labels.txt").read_text().split() == ["B-LOC", "B-PER", "I-PER", "O"]
    (t0, j0), (t1, j1) = _samples(out, "train-en-*.tar")
    assert t0 == "Paris is"
    assert t1 == "Anna Karenina http://x" and j1["language"] == "en"
    assert [t1[a:b] for a, b, _ in j1["words"]] == ["Anna", "Karenina", "http://x"]
    assert [i for *_, i in j1["words"]] == [0, 1, 2]
    assert [(t1[a:b], tag) for a, b, tag in j1["tags"]] == [
        ("Anna", "B-PER"), ("Karenina", "I-PER"), ("http://x", "O")]  # fmt: skip
    assert j0["line"] == 1 and j1["line"] == 4
    # a test split counts sentences with tags the vocabulary lacks; a later train split of
    # another language adds its tags to the vocabulary
    g = tmp_path / "de-test"
    g.write_text("de:Berlin\tB-LOC\nde:GmbH\tB-ORG\n")
    assert convert_tagging("conll", g, out, language="de")["unknown_labels"] == 1
    assert sorted(p.name for p in out.glob("test-de-*.tar")) == ["test-de-000000.tar"]
    h = tmp_path / "train-de"
    h.write_text("de:GmbH\tB-ORG\n")
    convert_tagging("conll", h, out, language="de")
    assert "B-ORG" in (out / "labels.txt").read_text().split()


def test_split_from_the_file_name():
    assert split_of("UD_English-EWT/en_ewt-ud-train.conllu") == "train"
    assert split_of("panx/de-test") == "test" and split_of("dev-en.tsv") == "dev"
    with pytest.raises(ValueError, match="give --split"):
        split_of("wikiann.tsv")


@pytest.mark.parametrize(
    "fmt, text, where, what",
    [
        ("conll", "Paris\tB-LOC\nParis\n", ":2:", "word<TAB>tag"),
        ("conll", "Paris\tB-LOC\n\tO\n", ":2:", "word<TAB>tag"),
        ("conllu", "# c\n1\tDo\tdo\tAUX\n", ":2:", "10 tab-separated columns, this one 4"),
        ("conllu", "1\tDo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_\nx\ty\ty\tX\t_\t_\t_\t_\t_\t_\n",
         ":2:", "ID 'x' is not a word index"),
        ("conllu", "1\tDo\tdo\t\tVBP\t_\t3\taux\t_\t_\n", ":1:", "empty FORM or UPOS"),
    ],
)  # fmt: skip
def test_a_malformed_line_is_one_line_naming_file_and_line(tmp_path, capsys, fmt, text, where,
                                                           what):  # fmt: skip
    f = tmp_path / "train.txt"
    f.write_text(text)
    line = cli_error(capsys, ["data", fmt, "--input", str(f), "--out", str(tmp_path / "o"),
                              "--lang", "en"])  # fmt: skip
    assert f"{f}{where}" in line and what in line
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").glob("*.tar"))


def test_cli_conllu_writes_shards(tmp_path, capsys):
    from mmptm.cli import main

    f = tmp_path / "fr_gsd-ud-test.conllu"
    f.write_text(CONLLU)
    assert main(["data", "conllu", "--input", str(f), "--out", str(tmp_path / "o"),
                 "--lang", "fr"]) == 0  # fmt: skip
    stats = json.loads(capsys.readouterr().out)
    assert stats["written"] == 2 and stats["skipped"] == {"no_text": 1}
    assert stats["split"] == "test" and stats["shards"][0].endswith("test-fr-000000.tar")
