"""`mmptm demo knowledge`'s cloze gives KnowBERT the candidate spans its training shards carry:
over the subject's name (with its gold entity), never over the masked answer; K-BERT's
attention by layer from the mask to the mention and from the mention to its branches."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import MATERIALS, TOYS

from mmptm.eval.cloze import ClozeItem, query_sample
from mmptm.studies.knowledge import cloze_annotator, tree_attention
from tests.eval.test_cloze_knowledge import kbert_overrides, made_of_probe


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


@pytest.mark.parametrize("knowledge", [True, False])
def test_tree_attention_by_layer(toy_text_run, tmp_path, knowledge):
    from mmptm.models.load import load_pretrained

    over = kbert_overrides(tmp_path, knowledge)
    layers = tree_attention(toy_text_run, made_of_probe(tmp_path), sentence=0, overrides=over)
    assert len(layers) == 1  # the toy run's one layer
    (row,) = layers
    if not knowledge:  # no branch: nothing to attend to
        assert row["mention_to_branch"] == 0 and row["mention_to_branch_uniform"] == 0
        return
    # by hand: a mention piece sees the sentence ([CLS] ... [SEP]) and its branch
    tok = load_pretrained(str(toy_text_run))[1]
    shares, pieces = 0.0, 0
    for i, toy in enumerate(TOYS):
        sentence = f"{toy} is made of {MATERIALS[i % len(MATERIALS)]}."
        ids, offsets = tok.encode_with_offsets(sentence)
        n = sum(a < b and a < len(toy) for a, b in offsets)  # the name's pieces
        branch = len(tok.encode(f"made of {MATERIALS[i % len(MATERIALS)]}"))
        shares += n * branch / (len(ids) + 2 + branch)
        pieces += n
    assert row["mention_to_branch_uniform"] == pytest.approx(shares / pieces)
    assert 0 < row["mention_to_branch"] < 1 and 0 < row["mask_to_mention"] < 1
