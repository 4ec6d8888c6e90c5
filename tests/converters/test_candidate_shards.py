"""``mmptm data candidates``: shared aliases, each text's candidate spans with the gold
index of its mention, by hand; shards copied with json.candidates, bad samples counted."""

from __future__ import annotations

import json
import tarfile

import pytest

from mmptm.cli import main as cli_main
from mmptm.converters.candidates import (
    CandidateGenerator,
    CandidateStats,
    sample_candidates,
    shared_aliases,
)
from mmptm.data.shards import ShardWriter

ALIASES = {"T1": ["Bimo"], "T2": ["Kato"], "M1": ["wood"], "M2": ["metal"]}


def test_shared_aliases_give_each_name_to_k_others():
    table = shared_aliases(ALIASES, 2, seed=1)
    assert table == shared_aliases(ALIASES, 2, seed=1)  # seeded
    for entity, names in ALIASES.items():
        owners = [e for e, aliases in table.items() if names[0] in aliases]
        assert entity in owners and len(owners) == 3  # its own and two others
    assert shared_aliases(ALIASES, 0) == ALIASES
    with pytest.raises(ValueError, match="confusers must be >= 0"):
        shared_aliases(ALIASES, -1)


def test_sample_candidates_by_hand():
    table = {**ALIASES, "T3": ["Bimo"]}
    gen = CandidateGenerator.build(table, degree={"T1": 1, "T3": 3}, vocabulary=None)
    stats = CandidateStats()
    text = "Bimo is made of wood and Kato"
    mentions = [[0, 4, "T1"], [16, 20, "M1"], [25, 29, "T9"], [5, 7, "T2"]]
    got = sample_candidates(text, mentions, gen, stats)
    # "Bimo": T3 (1 + 3) before T1 (1 + 1); the gold T1 is the second
    assert got[0] == [0, 4, ["T3", "T1"], [pytest.approx(4 / 6), pytest.approx(2 / 6)], 1]
    assert got[1] == [16, 20, ["M1"], [1.0], 0]
    assert got[2] == [25, 29, ["T2"], [1.0], -1]  # its gold T9 is no candidate
    assert len(got) == 3
    assert (stats.spans, stats.gold_spans, stats.gold_missed) == (3, 2, 1)
    assert (stats.mentions, stats.mentions_without_span) == (4, 1)  # "is" is no alias


def test_command_writes_candidates_and_counts_bad_samples(tmp_path):
    aliases = tmp_path / "aliases.txt"
    aliases.write_text("".join(f"{e}\t{n[0]}\n" for e, n in ALIASES.items()))
    with ShardWriter(str(tmp_path / "in" / "train-%06d.tar"), 10) as w:
        w.write({"__key__": "a", "txt": "Bimo is wood",
                 "json": json.dumps({"mentions": [[0, 4, "T1"]]})})  # fmt: skip
        w.write({"__key__": "b", "txt": "Kato", "json": "{not json"})
        w.write({"__key__": "c", "json": json.dumps({"x": 1})})  # no txt
    out = tmp_path / "out"
    argv = ["data", "candidates", "--input", f"{tmp_path}/in/*.tar", "--aliases", str(aliases),
            "--out", str(out), "--no-progress"]  # fmt: skip
    assert cli_main(argv) == 0
    summary = json.loads((out / "candidates.json").read_text())
    assert (summary["samples"], summary["bad"], summary["no_text"]) == (3, 1, 1)
    with tarfile.open(out / "train-000000.tar") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}
    assert json.loads(members["a.json"])["candidates"] == [
        [0, 4, ["T1"], [1.0], 0], [8, 12, ["M1"], [1.0], -1]]  # fmt: skip
    assert members["b.json"] == b"{not json" and members["b.txt"] == b"Kato"
