"""mmptm data pawsx: pairs as XNLI's, labels by name, skipped rows named by line."""

from __future__ import annotations

import json

from conftest import cli_error, read_shard_samples

from mmptm.converters.pawsx import convert_pawsx


def _jsons(out, pattern):
    rows = read_shard_samples(sorted(str(p) for p in out.glob(pattern)))
    return [(key, json.loads(m["json"])) for key, m in rows]


def test_pawsx_pairs_labels_and_skips(tmp_path, caplog):
    f = tmp_path / "test_2k.tsv"
    f.write_text(
        "id\tsentence1\tsentence2\tlabel\n"
        "1\tAnna owns \"Kato.\tKato is Anna's.\t1\n"  # an unbalanced quote stays in its line
        "2\tA\tB\t0\n"
        "3\tA\t\t1\n"  # an empty sentence (machine-translated sets have a few)
        "4\tA\tB\t2\n"
        "5\tonly two\n"
    )
    stats = convert_pawsx(f, tmp_path / "out", language="de")
    assert stats["written"] == 2 and stats["split"] == "test"
    assert stats["skipped"] == {"empty": 1, "unknown_label": 1, "malformed": 1}
    assert stats["skipped_lines"] == {"empty": [4], "unknown_label": [5], "malformed": [6]}
    assert f"{f}:6" in caplog.text
    (k1, j1), (_, j2) = _jsons(tmp_path / "out", "test-de-*.tar")
    assert j1 == {"premise": 'Anna owns "Kato.', "hypothesis": "Kato is Anna's.",
                  "label": "paraphrase", "language": "de", "pair_id": "1"}  # fmt: skip
    assert j2["label"] == "not_paraphrase" and k1 == "1"


def test_pawsx_header_is_checked(tmp_path, capsys):
    f = tmp_path / "train.tsv"
    f.write_text("sentence1\tsentence2\n")
    line = cli_error(capsys, ["data", "pawsx", "--input", str(f), "--out", str(tmp_path / "o"),
                              "--lang", "en"])  # fmt: skip
    assert str(f) in line and "PAWS-X header" in line
