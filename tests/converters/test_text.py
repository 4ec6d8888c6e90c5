"""Converters: real corpus layouts in, shards out; skips counted with reasons, errors name files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from conftest import read_shard_samples

from mmptm.converters import text as cv


def _json(paths: list[str]) -> list[dict]:
    return [json.loads(m["json"]) for _, m in read_shard_samples(paths)]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


XNLI_HEADER = "\t".join(cv.XNLI_COLUMNS)


def _xnli_row(
    lang: str, label: str, s1: str, s2: str, pair: str, columns: tuple[str, ...] = cv.XNLI_COLUMNS
) -> str:
    values = dict(zip(cv.XNLI_COLUMNS, [lang, label, "", "", "", "", s1, s2, "p" + pair, pair]))
    values |= {"genre": "fiction"} | {f"label{i}": label for i in range(1, 6)}
    return "\t".join(values[c] for c in columns)


def test_parallel_files_round_trip_and_blank_lines(tmp_path: Path) -> None:
    en = _write(tmp_path / "corpus.en", ["Hello .", "", "Resumption of the session", "Bye"])
    de = _write(tmp_path / "corpus.de", ["Hallo .", "Leer", "Wiederaufnahme der Sitzung", ""])
    stats = cv.convert_parallel_files(en, de, ("en", "de"), tmp_path / "out", shard_size=1)
    assert stats["written"] == 2 and stats["skipped"] == {"empty": 2}
    assert stats["skipped_lines"] == {"empty": [2, 4]}
    names = [Path(p).name for p in stats["shards"]]
    assert names == ["train-en-de-000000.tar", "train-en-de-000001.tar"]
    assert _json(stats["shards"]) == [
        {"languages": ["en", "de"], "texts": ["Hello .", "Hallo ."]},
        {
            "languages": ["en", "de"],
            "texts": ["Resumption of the session", "Wiederaufnahme der Sitzung"],
        },
    ]


def test_parallel_files_keep_alignment_with_stray_carriage_return(tmp_path: Path) -> None:
    """Moses files split at '\\n' only: a '\\r' inside a line must not shift the pairs."""
    en = tmp_path / "c.en"
    en.write_bytes(b"one\rmore\ntwo\n")
    de = _write(tmp_path / "c.de", ["eins", "zwei"])
    stats = cv.convert_parallel_files(en, de, ("en", "de"), tmp_path / "out")
    assert [r["texts"][1] for r in _json(stats["shards"])] == ["eins", "zwei"]


def test_parallel_files_with_different_line_counts_write_nothing(tmp_path: Path) -> None:
    en = _write(tmp_path / "corpus.en", ["a", "b", "c"])
    de = _write(tmp_path / "corpus.de", ["a", "b"])
    with pytest.raises(ValueError, match=r"corpus\.en has 3 lines.*corpus\.de has 2"):
        cv.convert_parallel_files(en, de, ("en", "de"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_parallel_tsv_counts_malformed_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tsv = _write(
        tmp_path / "tatoeba.tsv",
        ['"Hi, he said.\t"Hallo, sagte er.\t1276\t2', "only one column", "Ok.\tGut.", "\tleer"],
    )
    with caplog.at_level(logging.WARNING, logger="mmptm.converters.text"):
        stats = cv.convert_parallel_tsv(tsv, ("en", "de"), tmp_path / "out", split="val")
    assert stats["written"] == 2
    assert stats["skipped"] == {"malformed": 1, "empty": 1}
    assert stats["skipped_lines"] == {"malformed": [2], "empty": [4]}
    assert f"{tsv}:2" in caplog.text
    assert Path(stats["shards"][0]).name == "val-en-de-000000.tar"
    assert [r["texts"] for r in _json(stats["shards"])] == [
        ['"Hi, he said.', '"Hallo, sagte er.'],  # unbalanced quotes stay text
        ["Ok.", "Gut."],
    ]


def test_monolingual(tmp_path: Path) -> None:
    path = _write(tmp_path / "news.de", ["Erster Satz.", "", "  ", "Zweiter Satz."])
    stats = cv.convert_monolingual(path, "de", tmp_path / "out")
    assert stats["written"] == 2 and stats["skipped"] == {"empty": 2}
    assert Path(stats["shards"][0]).name == "train-de-000000.tar"
    samples = read_shard_samples(stats["shards"])
    assert [m["txt"].decode() for _, m in samples] == ["Erster Satz.", "Zweiter Satz."]
    assert all(json.loads(m["json"]) == {"language": "de"} for _, m in samples)


def test_bad_language_code(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.txt", ["a"])
    with pytest.raises(ValueError, match="language code"):
        cv.convert_monolingual(path, "zh.cn", tmp_path / "out")


def test_xnli_1_0_layout(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # the real header and order: rows grouped by language
    tsv = _write(
        tmp_path / "xnli.dev.tsv",
        [
            XNLI_HEADER,
            _xnli_row("de", "entailment", '"Ja, sagte er.', "Er sagte etwas.", "1"),
            _xnli_row("de", "-", "Keine Einigung.", "Egal.", "2"),
            _xnli_row("de", "contradiction", "Es regnet.", "Es ist trocken.", "3"),
            _xnli_row("de", "maybe", "Vielleicht.", "Wer weiß.", "4"),
            _xnli_row("en", "neutral", '"Yes, he said.', "He smiled.", "1"),
            "en\tentailment\ttoo short",
        ],
    )
    with caplog.at_level(logging.WARNING, logger="mmptm.converters.text"):
        stats = cv.convert_xnli(tsv, tmp_path / "out", split="val", shard_size=1)
    assert stats["format"] == "xnli"
    assert stats["written"] == 3
    assert stats["skipped"] == {"no_gold_label": 1, "unknown_label": 1, "malformed": 1}
    assert stats["skipped_lines"] == {"no_gold_label": [3], "unknown_label": [5], "malformed": [7]}
    assert f"{tsv}:5" in caplog.text and f"{tsv}:7" in caplog.text
    assert f"{tsv}:3" not in caplog.text  # "-" is routine: counted, not warned
    assert {k: v["written"] for k, v in stats["languages"].items()} == {"de": 2, "en": 1}
    assert [Path(p).name for p in stats["languages"]["de"]["shards"]] == [
        "val-de-000000.tar",
        "val-de-000001.tar",
    ]
    assert _json(stats["languages"]["de"]["shards"]) == [
        {
            "premise": '"Ja, sagte er.',  # the unbalanced quote did not swallow later lines
            "hypothesis": "Er sagte etwas.",
            "label": "entailment",
            "language": "de",
            "pair_id": "1",
        },
        {
            "premise": "Es regnet.",
            "hypothesis": "Es ist trocken.",
            "label": "contradiction",
            "language": "de",
            "pair_id": "3",
        },
    ]
    only_en = cv.convert_xnli(tsv, tmp_path / "en", split="val", language="en")
    assert only_en["written"] == 1 and only_en["skipped"]["other_language"] == 4


def test_xnli_columns_are_found_by_name(tmp_path: Path) -> None:
    columns = tuple(reversed(cv.XNLI_COLUMNS))
    row = _xnli_row("ru", "neutral", "Идёт дождь.", "Холодно.", "9", columns)
    tsv = _write(tmp_path / "xnli.test.tsv", ["\t".join(columns), row])
    stats = cv.convert_xnli(tsv, tmp_path / "out", split="test")
    assert Path(stats["shards"][0]).name == "test-ru-000000.tar"
    assert _json(stats["shards"]) == [
        {
            "premise": "Идёт дождь.",
            "hypothesis": "Холодно.",
            "label": "neutral",
            "language": "ru",
            "pair_id": "9",
        }
    ]


def test_multinli_train_layout(tmp_path: Path) -> None:
    mnli = cv.XNLI_COLUMNS[1:]
    header = "\t".join(mnli)
    rows = [
        _xnli_row("", "entailment", '" during the season', "y", "101457e", mnli),
        _xnli_row(
            "", "neutral", "Conceptually cream skimming has two dimensions.", "x", "31193n", mnli
        ),
    ]
    tsv = _write(tmp_path / "multinli_1.0_train.txt", [header, *rows])
    stats = cv.convert_xnli(tsv, tmp_path / "out", split="train")
    assert stats["format"] == "multinli" and stats["skipped"] == {}
    assert [Path(p).name for p in stats["shards"]] == ["train-en-000000.tar"]
    records = _json(stats["shards"])
    assert [(r["premise"], r["label"], r["language"], r["pair_id"]) for r in records] == [
        ('" during the season', "entailment", "en", "101457e"),
        ("Conceptually cream skimming has two dimensions.", "neutral", "en", "31193n"),
    ]
    assert [k for k, _ in read_shard_samples(stats["shards"])] == ["101457e", "31193n"]


def test_xnli_mt_translate_train_layout(tmp_path: Path) -> None:
    tsv = _write(
        tmp_path / "multinli.train.fr.tsv",
        [
            "premise\thypo\tlabel",
            "Il pleut.\tIl fait sec.\tcontradictory",
            '"Oui, dit-il.\tIl a parlé.\tentailment',
            "ligne cassée",
        ],
    )
    stats = cv.convert_xnli(tsv, tmp_path / "out", split="train", language="fr")
    assert stats["format"] == "xnli-mt" and stats["skipped"] == {"malformed": 1}
    assert [Path(p).name for p in stats["shards"]] == ["train-fr-000000.tar"]
    assert _json(stats["shards"]) == [
        {
            "premise": "Il pleut.",
            "hypothesis": "Il fait sec.",
            "label": "contradiction",
            "language": "fr",
            "pair_id": "2",
        },
        {
            "premise": '"Oui, dit-il.',
            "hypothesis": "Il a parlé.",
            "label": "entailment",
            "language": "fr",
            "pair_id": "3",
        },
    ]


def test_duplicate_pair_ids_get_unique_keys(tmp_path: Path) -> None:
    rows = [_xnli_row("en", "neutral", f"s{i}", "h", "7.1") for i in range(3)]
    tsv = _write(tmp_path / "dup.tsv", [XNLI_HEADER, *rows])
    stats = cv.convert_xnli(tsv, tmp_path / "out", split="test")
    keys = [k for k, _ in read_shard_samples(stats["shards"])]
    assert len(set(keys)) == 3 and all("." not in k for k in keys)
    assert [r["pair_id"] for r in _json(stats["shards"])] == ["7.1"] * 3


def test_unknown_nli_header_names_file_and_columns(tmp_path: Path) -> None:
    tsv = _write(tmp_path / "weird.tsv", ["text_a\ttext_b\tscore", "a\tb\t1"])
    with pytest.raises(ValueError, match=r"weird\.tsv.*'text_a', 'text_b', 'score'"):
        cv.convert_xnli(tsv, tmp_path / "out", split="train")
    assert not (tmp_path / "out").exists()
