"""toyworld's Tatoeba and BUCC analogues: the real formats, translations where the gold says."""

from __future__ import annotations

import pytest

from mmptm.eval.bucc import read_bucc
from mmptm.eval.xlingual import read_pairs
from mmptm.toyworld.language import describe
from mmptm.toyworld.retrieval import write_retrieval
from mmptm.toyworld.scene import sample_scene


def test_analogues_pair_translations_of_one_scene(tmp_path):
    write_retrieval(tmp_path, languages=("de", "ru"), n_tatoeba=6, n_bucc=8, parallel=0.25)
    pairs = read_pairs(f"{tmp_path}/tatoeba/shards/test-*.tar", "en", 0)
    assert sorted(pairs) == ["de", "ru"]
    for i, (en, ru) in enumerate(pairs["ru"]):
        scene = sample_scene(0, "test", i)
        assert (en, ru) == (describe(scene, "en"), describe(scene, "ru"))
    for name, split in (("sample", "val"), ("training", "test")):
        s = read_bucc(f"{tmp_path}/bucc/shards/{name}-*.tar")["de"]
        assert len(s.source) == len(s.target) == 8 and len(s.gold) == 2
        for a, b in s.gold:  # the gold pairs are one scene's captions
            i = int(a.split("-")[1])
            assert b == f"en-{i:09d}"
            scene = sample_scene(0, split, i)
            assert (s.source[a], s.target[b]) == (describe(scene, "de"), describe(scene, "en"))
        # the other target sentences are other scenes' captions
        assert {int(b.split("-")[1]) for b in s.target} - {0, 1} == set(range(8, 14))
    assert (tmp_path / "bucc" / "de-en.sample.gold").read_text().count("\n") == 2


def test_bad_settings_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="'en' is not a toyworld language other than en"):
        write_retrieval(tmp_path, languages=("en",))
    with pytest.raises(ValueError, match="--parallel 0: the share of translations"):
        write_retrieval(tmp_path, parallel=0)
