"""toyworld's tagged mentions and answer spans: one mention per object in every language, the
questions answered by their object, and the files through the real converters."""

from __future__ import annotations

import json

import pytest
from conftest import read_shard_samples

from mmptm.toyworld.language import LANGUAGES, LEXICON, describe
from mmptm.toyworld.scene import sample_scene
from mmptm.toyworld.tasks import mentions, questions, tagged_words, write_tasks

SCENES = [sample_scene(0, "train", i) for i in range(150)]


def _forms(entry) -> set[str]:
    return {entry.lower()} if isinstance(entry, str) else {f.lower() for f in entry.values()}


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_object_is_one_mention_of_its_shape_and_colour(lang):
    for scene in SCENES:
        text = describe(scene, lang)
        found = mentions(text, lang)
        assert len(found) == len(scene.objects), text
        # each object (a distinct colour and shape) is exactly one mention
        for obj in scene.objects:
            colors = _forms(LEXICON[lang]["colors"][obj.color])
            hits = [(a, b) for a, b, shape in found if shape == obj.shape
                    and colors & {w.lower() for w in text[a:b].split()}]  # fmt: skip
            assert len(hits) == 1, (text, obj)


def test_tags_by_hand():
    words, tags = tagged_words("Ein kleiner roter Kreis ist über einer großen Raute.", "de")
    assert words == ["Ein", "kleiner", "roter", "Kreis", "ist", "über", "einer", "großen",
                     "Raute", "."]  # fmt: skip
    assert tags == ["B-CIRCLE", "I-CIRCLE", "I-CIRCLE", "I-CIRCLE", "O", "O", "B-DIAMOND",
                    "I-DIAMOND", "I-DIAMOND", "O"]  # fmt: skip
    words, tags = tagged_words("Un cercle vert est à gauche d'une étoile bleue.", "fr")
    assert words[5:9] == ["gauche", "d'une", "étoile", "bleue"]
    assert tags[5:9] == ["O", "B-STAR", "I-STAR", "I-STAR"]


@pytest.mark.parametrize("lang", LANGUAGES)
def test_questions_are_answered_by_the_object_of_that_colour(lang):
    for scene in SCENES[:50]:
        text = describe(scene, lang)
        colors = [o.color for o in scene.objects]
        qs = questions(scene, lang)
        assert len(qs) == sum(colors.count(c) == 1 for c in colors)
        for q in qs:
            (answer,) = q["answers"]
            color = q["id"].rsplit("_", 1)[1]
            start = answer["answer_start"]
            assert text[start : start + len(answer["text"])] == answer["text"]
            assert _forms(LEXICON[lang]["colors"][color]) & set(answer["text"].lower().split())


def test_files_and_shards_through_the_converters(tmp_path):
    stats = write_tasks(tmp_path, n_train=12, n_test=4, languages=("en", "ru"))
    assert stats["train-en"]["sentences"] == 12 and stats["test-ru"]["sentences"] == 4
    labels = (tmp_path / "tagging" / "shards" / "labels.txt").read_text().split()
    assert "O" in labels and all(t == "O" or t[:2] in ("B-", "I-") for t in labels)
    rows = read_shard_samples(sorted(map(str, (tmp_path / "qa" / "shards").glob("test-ru-*"))))
    metas = [json.loads(m["json"]) for _, m in rows]
    assert len(metas) == stats["test-ru"]["questions"] > 0
    assert all(m["premise"].startswith("Какой предмет") for m in metas)
    assert (tmp_path / "tagging" / "train-en.tsv").read_text().startswith("A\tB-")
