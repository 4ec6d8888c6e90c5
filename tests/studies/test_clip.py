"""The clip study's attribute queries: the fixed grid and its precision@3 against an index."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mmptm import toyworld
from mmptm.studies.clip import (
    ATTRIBUTE_GRID,
    CLIP_DEMO_LANGS,
    DEMO_QUERIES,
    attribute_precision,
    attribute_queries,
    format_precision,
)


def test_grid_is_every_size_colour_and_shape_in_every_language() -> None:
    assert len(ATTRIBUTE_GRID) == len(set(ATTRIBUTE_GRID)) == 2 * 6 * 5
    for lang in CLIP_DEMO_LANGS:
        queries = attribute_queries(lang)
        assert [attrs for _, attrs in queries] == list(ATTRIBUTE_GRID)
        assert len({q for q, _ in queries}) == len(queries)  # no two points read alike
    # the demo's printed queries are points of the grid
    for query, lang in DEMO_QUERIES:
        assert query in {q for q, _ in attribute_queries(lang)}
    assert ("a large red circle", ("large", "red", "circle")) in attribute_queries("en")


class _Index:
    """A stand-in index: every query finds the same three test images."""

    def __init__(self, keys):
        self.keys, self.asked = keys, []

    def search_text(self, query, k, lang):
        self.asked.append((query, k, lang))
        return [SimpleNamespace(key=key) for key in self.keys[:k]]


def test_attribute_precision_reads_relevance_off_the_test_scenes() -> None:
    n_test, seed = 40, 0
    scenes = [toyworld.sample_scene(seed, "test", i) for i in range(n_test)]
    top = [s.key for s in scenes[:3]]
    index = _Index(top)
    got = attribute_precision(index, seed, n_test, ["en", "ru"])
    assert set(got) == {"en", "ru"} and len(index.asked) == 2 * len(ATTRIBUTE_GRID)
    assert {(k, lang) for _, k, lang in index.asked} == {(3, "en"), (3, "ru")}
    en = got["en"]
    assert en["queries"] + en["skipped"] == len(ATTRIBUTE_GRID)
    # by hand: the share of the three images holding the query's object, over queries with
    # at least three such images among the 40
    per_query = []
    held = [{(o.size, o.color, o.shape) for o in s.objects} for s in scenes]
    for attrs in ATTRIBUTE_GRID:
        holding = [s.key for s, objects in zip(scenes, held) if attrs in objects]
        if len(holding) >= 3:
            per_query.append(sum(key in holding for key in top) / 3)
    assert en["queries"] == len(per_query) > 0
    assert en["precision"] == pytest.approx(sum(per_query) / len(per_query))
    assert got["ru"]["precision"] == en["precision"]  # same answers, same relevance
    assert en["examples"]["a large red circle"] == top
    assert got["ru"]["examples"]["большой синий квадрат"] == top
    table = format_precision(got)
    assert "P@3" in table and f"{100 * en['precision']:.1f}%" in table
