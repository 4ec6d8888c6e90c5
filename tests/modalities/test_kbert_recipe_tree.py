"""kbert_tiny's injection settings on toyworld's real knowledge graph: every toy's mention gets
a branch for each relation the cloze asks about (made_of, owned_by, comes_from), its tail
named in the sentence's language, as the cloze's answer is (``Metall`` in German, not
``metal``). The expected names come from the toyworld generator's world, not from the
injection stage."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmptm.modalities.base import DataContext
from mmptm.modalities.sentence_tree import SentenceTreeData
from mmptm.recipe import load_run_config
from mmptm.studies.common import relocated
from mmptm.toyworld.knowledge import FACT_RELATIONS, build_world, graph_files

LANGS = ("en", "de", "fr", "ru", "es")  # `mmptm data toyworld`'s default languages


class _Tok:
    """Words → ids (one piece per word) and back, enough for the injection stage."""

    pad_id = 0
    languages = LANGS

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, 100 + len(self.vocab)) for w in text.split()]

    def words(self, ids: list[int]) -> str:
        back = {i: w for w, i in self.vocab.items()}
        return " ".join(back[i] for i in ids)


@pytest.fixture(scope="module")
def world_graph(tmp_path_factory) -> tuple[Path, object]:
    """toyworld's ``knowledge/graph`` files (seed 0) and TransE's entity list, under a root
    with toyworld's layout; returns (root, the generator's world)."""
    root = tmp_path_factory.mktemp("toyworld")
    world = build_world(0)
    graph = root / "knowledge" / "graph"
    graph.mkdir(parents=True)
    for name, text in graph_files(world, LANGS).items():
        (graph / name).write_text(text, encoding="utf-8")
    (root / "knowledge" / "transe").mkdir()
    ids = [e for e, _ in world.entities()]
    (root / "knowledge" / "transe" / "entities.txt").write_text("".join(f"{e}\n" for e in ids))
    return root, world


def _tree_stage(recipe: str, root: Path, tok: _Tok, *extra: str):
    """The sentence-tree batch stage with the recipe's fusion settings, paths moved to root."""
    f = load_run_config(recipe, [*relocated(recipe, root), *extra]).model.fusion
    cfg = SentenceTreeData.Config(
        graph=f.graph, entities=f.entities, aliases=dict(f.aliases),
        max_entity_triples=f.max_entity_triples, max_triples=f.max_triples, max_len=f.max_len,
    )  # fmt: skip
    plugin = SentenceTreeData(cfg, views=["text"], context=DataContext(tokenizer=tok))
    (stage,) = plugin.transforms()
    return stage


def _branches(stage, tok: _Tok, lang: str, n_toys: int) -> list[list[str]]:
    """Per toy, the branches injected into ``[CLS] <toy> is here [SEP]`` in ``lang``."""
    ids = torch.tensor([[1, 10, 11, 12, 2]] * n_toys)
    ents = torch.full_like(ids, -1)
    ents[:, 1] = torch.arange(n_toys)  # entities.txt lists the toys first
    batch = {
        "input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "entity_ids": ents, "entity_mask": ents >= 0,
        "lang_ids": torch.full_like(ids, LANGS.index(lang)),
    }  # fmt: skip
    out = stage(batch, torch.Generator())
    rows = []
    for b in range(n_toys):
        inj = out["injected_mask"][b].tolist()
        ids_b = out["input_ids"][b].tolist()
        # branches follow the one-piece mention at 1 and share positions 2, 3, ...
        pos = out["position_ids"][b].tolist()
        starts = [i for i in range(len(ids_b)) if inj[i] and pos[i] == 2]
        ends = [*starts[1:], max(i for i in range(len(ids_b)) if inj[i]) + 1]
        rows.append([tok.words(ids_b[s:e]) for s, e in zip(starts, ends, strict=True)])
    return rows


@pytest.mark.parametrize("lang", LANGS)
def test_each_probed_relation_injected_with_the_tail_in_the_sentence_language(world_graph, lang):
    root, world = world_graph
    tok = _Tok()
    names = dict(world.entities())
    got = _branches(_tree_stage("kbert_tiny", root, tok), tok, lang, len(world.toys))
    for toy, branches in zip(world.toys, got, strict=True):
        expected = [f"{r.replace('_', ' ')} {names[toy.facts[r]][lang]}" for r in FACT_RELATIONS]
        assert branches == expected, toy.id


def test_the_old_settings_miss_comes_from_and_name_tails_in_english(world_graph):
    """What the test above catches: two triples per entity and one alias file for every
    language (kbert_tiny before 2026-11-27)."""
    root, world = world_graph
    tok = _Tok()
    old = ("model.fusion.max_entity_triples=2",
           f"model.fusion.aliases={{'*': {root}/knowledge/graph/aliases.txt}}")  # fmt: skip
    stage = _tree_stage("kbert_tiny", root, tok, *old)
    got = _branches(stage, tok, "de", len(world.toys))
    assert all(len(b) == 2 and not b[1].startswith("comes from") for b in got)
    metal = [t for t in world.toys if t.facts["made_of"] == "M02"]
    assert metal and got[world.toys.index(metal[0])][0] == "made of metal"  # not "Metall"


def test_kbert_base_keeps_the_papers_two_triples():
    f = load_run_config("kbert_base").model.fusion
    assert f.max_entity_triples == 2
