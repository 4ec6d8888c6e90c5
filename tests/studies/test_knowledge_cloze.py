"""`mmptm demo knowledge`'s cloze gives KnowBERT the candidate spans its training shards carry:
over the subject's name (with its gold entity), never over the masked answer."""

from __future__ import annotations

from types import SimpleNamespace

from mmptm.eval.cloze import ClozeItem, query_sample
from mmptm.studies.knowledge import cloze_annotator


def _data(tmp_path):
    k = tmp_path / "knowledge"
    (k / "graph").mkdir(parents=True)
    (k / "transe").mkdir()
    (k / "graph" / "aliases.txt").write_text("T0\tBimo\nT1\tKato\nM0\twood\nM1\ttin\n")
    (k / "graph" / "train.txt").write_text("T0\tmade_of\tM0\nT1\tmade_of\tM1\n")
    (k / "transe" / "entities.txt").write_text("T0\nT1\nM0\nM1\n")
    return tmp_path


def test_candidate_spans_over_the_subject_not_the_answer(tmp_path):
    cfg = SimpleNamespace(model=SimpleNamespace(fusion=SimpleNamespace(candidates="cands")))
    annotate = cloze_annotator(cfg, _data(tmp_path), seed=0)
    item = ClozeItem(["Kato is made of [MASK] ."], "Kato", "tin", "made_of", "T1")
    for value in ("wood", "tin"):  # both are aliases: their spans would name the answer
        sample = annotate(query_sample(item, 0, value, "en", "k"))
        assert sample["txt"] == f"Kato is made of {value}."
        (span,) = sample["json"]["cands"]
        start, end, entities, priors, gold = span
        assert (start, end) == (0, 4)
        # 3 confusers among 4 entities: every other entity shares the name "Kato"
        assert sorted(entities) == ["M0", "M1", "T0", "T1"] and entities[gold] == "T1"
        assert abs(sum(priors) - 1) < 1e-5


def test_runs_without_candidate_spans_get_no_annotator(tmp_path):
    cfg = SimpleNamespace(model=SimpleNamespace(fusion=SimpleNamespace(type="kbert")))
    assert cloze_annotator(cfg, tmp_path, seed=0) is None
