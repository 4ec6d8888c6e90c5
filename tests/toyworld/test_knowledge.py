"""toyworld's knowledge view: checked against the graph files and the shards, read back
independently of the code that wrote them."""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mmptm import toyworld
from mmptm.cli import main
from mmptm.kg.graph import load_graph, read_aliases
from tests.conftest import read_shard_samples

LANGS = ("en", "de", "fr", "ru", "es")
SMALL = {"n_train": 40, "n_val": 12, "n_test": 12, "image_size": 32, "shard_size": 25}


def _generate(out: Path, **kw) -> Path:
    toyworld.generate(out, **{**SMALL, **kw}, languages=LANGS, views=("knowledge",))
    return out / "knowledge"


@pytest.fixture(scope="module")
def kdir(tmp_path_factory) -> Path:
    return _generate(tmp_path_factory.mktemp("kw") / "tw")


def _samples(kdir: Path, pattern: str) -> list[tuple[str, dict[str, bytes]]]:
    return read_shard_samples(sorted(str(p) for p in kdir.glob(pattern)))


def _facts(kdir: Path) -> dict[tuple[str, str], str]:
    """(head, relation) -> tail of graph/train.txt, read back with load_graph."""
    g = load_graph(kdir / "graph")
    ents, rels = g.entities.names, g.relations.names
    out = {}
    for h, r, t in g.splits["train"].tolist():
        if rels[r] != "friend_of":
            assert (ents[h], rels[r]) not in out, "a toy has two values of one relation"
            out[ents[h], rels[r]] = ents[t]
    return out


def _toys(kdir: Path) -> list[dict]:
    return json.loads((kdir / "graph" / "toys.json").read_text(encoding="utf-8"))


def test_not_a_default_view():
    assert "knowledge" not in toyworld.VIEWS and "knowledge" in toyworld.ALL_VIEWS


def test_graph_layout_and_toys(kdir):
    facts = _facts(kdir)
    toys = _toys(kdir)
    assert len(toys) == 60 and sum(t["facts_in_text"] for t in toys) == 30
    looks = {(t["shape"], t["color"], t["size"]) for t in toys}
    assert len(looks) == 60  # the image identifies the toy
    for t in toys:
        assert {r: facts[t["id"], r] for r in ("made_of", "owned_by", "comes_from")} == t["facts"]
        assert t["names"]["ru"] != t["names"]["en"] and re.fullmatch("[А-Яа-я]+", t["names"]["ru"])
    g = load_graph(kdir / "graph")
    assert len(g.splits["valid"]) and len(g.splits["test"]) and not sum(g.unknown.values())
    rel = g.relations.names
    assert {rel[r] for r in g.splits["test"][:, 1]} == {"friend_of"}
    # a held-out friend pair shares friends in training: link prediction can infer it
    train = {(h, t) for h, r, t in g.splits["train"].tolist() if rel[r] == "friend_of"}
    for h, _, t in g.splits["test"].tolist():
        common = {b for a, b in train if a == h} & {b for a, b in train if a == t}
        assert len(common) >= 2
    assert set(read_aliases(kdir / "graph" / "aliases.txt")) == set(g.entities.names)


def test_mentions_are_the_aliases(kdir):
    n = 0
    for lang in LANGS:
        aliases = read_aliases(kdir / "graph" / f"aliases.{lang}.txt")
        for _, s in _samples(kdir, f"text/*-{lang}-*.tar"):
            text, meta = s["txt"].decode(), json.loads(s["json"])
            assert meta["language"] == lang
            for start, end, entity in meta["mentions"]:
                assert text[start:end] in aliases[entity]
                n += 1
        for _, s in _samples(kdir, "image_text/*.tar"):
            meta = json.loads(s["json"])
            caption = meta["captions"][lang]
            n_fact = meta["caption_fact"] is not None  # the opening fact's value
            assert len(meta["mentions"][lang]) == len(meta["region_entities"]) + n_fact
            for start, end, entity in meta["mentions"][lang]:
                assert caption[start:end] in aliases[entity]
    assert n > 500


def test_no_fact_of_a_graph_only_toy_in_text(kdir):
    toys = _toys(kdir)
    stated = Counter()
    for lang in LANGS:
        aliases = read_aliases(kdir / "graph" / f"aliases.{lang}.txt")
        values = [a for e, names in aliases.items() if e[0] in "MPL" for a in names]
        value_re = re.compile(r"(?<!\w)(" + "|".join(map(re.escape, values)) + r")(?!\w)", re.I)
        for _, s in _samples(kdir, f"text/*-{lang}-*.tar"):
            text = s["txt"].decode()
            for t in toys:
                if re.search(rf"(?<!\w){re.escape(t['names'][lang])}(?!\w)", text):
                    found = value_re.findall(text)
                    stated[t["facts_in_text"]] += bool(found)
                    if not t["facts_in_text"]:
                        assert not found, f"{lang}: {text!r} names a value"
    assert stated[True] > 50 and stated[False] == 0  # the scan does see facts of text toys


_PICTURED_EN = re.compile(r"The (\w+) (\w+) (is made of|belongs to|comes from) (\w+)\. ")
_EN_RELATION = {"is made of": "made_of", "belongs to": "owned_by", "comes from": "comes_from"}


def test_captions_state_one_fact_of_a_pictured_text_toy(kdir):
    """Every caption opens with one fact of a pictured toy whose facts the text states,
    the toy called by its colour and shape (no mention), and names no other value."""
    facts = _facts(kdir)
    toys = {t["id"]: t for t in _toys(kdir)}
    values = {v["id"]: v for v in json.loads((kdir / "graph" / "values.json").read_text())}
    seen = Counter()
    for _, s in _samples(kdir, "image_text/*.tar"):
        meta = json.loads(s["json"])
        told = [e for e in meta["region_entities"] if toys[e]["facts_in_text"]]
        caption = meta["captions"]["en"]
        m = _PICTURED_EN.match(caption)
        if not told:
            assert m is None and meta["caption_fact"] is None, caption
            seen["none"] += 1
            continue
        assert m, caption
        color, shape, verb, word = m.group(1, 2, 3, 4)
        (i,) = [i for i, o in enumerate(meta["objects"])
                if (o["color"], o["shape"]) == (color, shape)]  # fmt: skip
        entity = meta["region_entities"][i]
        assert toys[entity]["facts_in_text"]
        answer = facts[entity, _EN_RELATION[verb]]
        assert values[answer]["names"]["en"] == word
        assert meta["caption_fact"] == {
            "region": i,
            "entity": entity,
            "relation": _EN_RELATION[verb],
            "answer_entity": answer,
        }
        for lang in LANGS:  # the same fact in every language, and no other value
            named = [v for v in values.values()
                     if re.search(rf"(?<!\w){re.escape(v['names'][lang])}(?!\w)",
                                  meta["captions"][lang])]  # fmt: skip
            assert [v["id"] for v in named] == [answer], meta["captions"][lang]
            # in the fact's sentence the value is a mention, the pictured toy is not
            opening = meta["captions"][lang].index(". ") + 1
            inside = [e for start, _, e in meta["mentions"][lang] if start < opening]
            assert inside == [answer]
        seen["fact"] += 1
    assert seen["fact"] > 30 and seen["none"] > 0


def test_downstream_answers_agree_with_the_graph(kdir):
    facts = _facts(kdir)
    values = {v["id"]: v for v in json.loads((kdir / "graph" / "values.json").read_text())}
    group = {t["id"]: "text" if t["facts_in_text"] else "graph" for t in _toys(kdir)}
    for lang in LANGS:
        lines = [json.loads(x) for x in (kdir / "probe" / f"cloze.{lang}.jsonl").open()]
        assert len(lines) == 180
        for x in lines:
            assert facts[x["sub_uri"], x["predicate_id"]] == x["obj_uri"]
            assert x["obj_label"] == values[x["obj_uri"]]["names"][lang]
            assert x["facts"] == group[x["sub_uri"]]
            assert all(s.count("[MASK]") == 1 for s in x["masked_sentences"])
    split_toys = {}
    for split in ("train", "dev", "test"):
        typing = [json.loads(x) for x in (kdir / "typing" / f"{split}.json").open()]
        for x in typing:
            own = [facts[x["entity"], r] for r in ("made_of", "owned_by", "comes_from")]
            assert x["y_str"] == ["toy", *(values[v]["type"] for v in own)]
            assert x["facts"] == group[x["entity"]]
        relations = json.loads((kdir / "relations" / f"{split}.json").read_text())
        for x in relations:
            true = [r for r in ("made_of", "owned_by", "comes_from")
                    if facts[x["subj_id"], r] == x["obj_id"]]  # fmt: skip
            assert x["relation"] == (true[0] if true else "no_relation")
            assert x["facts"] == group[x["subj_id"]]
        labels = Counter(x["relation"] == "no_relation" for x in relations)
        assert labels[True] == labels[False]
        split_toys[split] = {x["entity"] for x in typing}
        assert {group[t] for t in split_toys[split]} == {"text", "graph"}
        assert {x["subj_id"] for x in relations} == split_toys[split]
    assert not (split_toys["train"] & (split_toys["dev"] | split_toys["test"]))
    n = 0  # question ids are unique within a split (scene index * 10 + k), as toyworld's vqa
    kvqa = [s for split in ("train", "val", "test") for s in _samples(kdir, f"kvqa/{split}-*.tar")]
    for _, s in kvqa:
        q = json.loads(s["json"])
        assert facts[q["entity"], q["relation"]] == q["answer_entity"]
        assert q["multiple_choice_answer"] == values[q["answer_entity"]]["names"]["en"].lower()
        assert Counter(q["answers"]).most_common(1)[0][0] == q["multiple_choice_answer"]
        assert q["region_entities"][q["region"]] == q["entity"] and q["facts"] == group[q["entity"]]
        n += 1
    assert n > 20


def test_relation_spans_point_at_the_names(kdir):
    toys = {t["id"]: t for t in _toys(kdir)}
    values = {v["id"]: v for v in json.loads((kdir / "graph" / "values.json").read_text())}
    for x in json.loads((kdir / "relations" / "test.json").read_text()):
        assert x["token"][x["subj_start"] : x["subj_end"] + 1] == [
            toys[x["subj_id"]]["names"]["en"]
        ]
        assert x["token"][x["obj_start"] : x["obj_end"] + 1] == [values[x["obj_id"]]["names"]["en"]]


def test_probe_wording_is_not_in_the_training_text(kdir):
    for lang in LANGS:
        text = " ".join(s["txt"].decode() for _, s in _samples(kdir, f"text/train-{lang}-*.tar"))
        lines = [json.loads(x) for x in (kdir / "probe" / f"cloze.{lang}.jsonl").open()]
        seen = 0
        for x in lines:
            held_out, used = (
                s.replace("[MASK]", x["obj_label"])[:-2] for s in x["masked_sentences"]
            )
            assert held_out not in text
            seen += used in text
        assert seen > 10  # the other wording is the training one


def test_regions_are_the_toys(kdir):
    toys = {t["id"]: t for t in _toys(kdir)}
    for _, s in _samples(kdir, "image_text/*.tar"):
        meta = json.loads(s["json"])
        npz = np.load(io.BytesIO(s["regions.npz"]))
        assert len(npz["boxes"]) == len(meta["objects"]) == len(meta["region_entities"])
        for label, obj, entity in zip(npz["labels"], meta["objects"], meta["region_entities"]):
            toy = toys[entity]
            assert toyworld.SHAPES[int(label)] == toy["shape"]
            assert (obj["shape"], obj["color"], obj["size"]) == (
                toy["shape"], toy["color"], toy["size"])  # fmt: skip


def test_majority_guess_on_graph_only_toys_is_chance(kdir):
    facts = _facts(kdir)
    group = {t["id"]: t["facts_in_text"] for t in _toys(kdir)}
    chance = {"made_of": 1 / 6, "owned_by": 1 / 8, "comes_from": 1 / 10}
    for relation, p in chance.items():
        text = Counter(v for (h, r), v in facts.items() if r == relation and group[h])
        guess = text.most_common(1)[0][0]
        graph = [v for (h, r), v in facts.items() if r == relation and not group[h]]
        assert len(graph) == 30
        assert abs(np.mean([v == guess for v in graph]) - p) < 0.05


def test_train_embeddings_and_link_read_it(kdir, tmp_path):
    assert main(["kg", "train-embeddings", str(kdir / "graph"), "--out", str(tmp_path / "kge"),
                 "--epochs", "1", "--dim", "8"]) == 0  # fmt: skip
    ids = (tmp_path / "kge" / "entities.txt").read_text().split()
    assert len(ids) == 60 + 6 + 8 + 10
    for lang in ("en", "ru"):
        shards = sorted(kdir.glob(f"text/val-{lang}-*.tar"))
        aliases = f"{lang}={kdir / 'graph' / f'aliases.{lang}.txt'}"
        out = tmp_path / f"linked-{lang}"
        argv = ["data", "link", "--input", str(shards[0]), "--aliases", aliases, "--out", str(out)]
        assert main(argv) == 0
        ours = {
            k: json.loads(s["json"])["mentions"] for k, s in read_shard_samples([str(shards[0])])
        }
        linked = read_shard_samples([str(out / shards[0].name)])
        assert {k: json.loads(s["json"])["mentions"] for k, s in linked} == ours
        assert sum(map(len, ours.values())) > 20


def _bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_deterministic_and_test_split_stable(kdir, tmp_path):
    again = _bytes(_generate(tmp_path / "a"))
    assert again == _bytes(kdir)
    bigger = _bytes(_generate(tmp_path / "b", n_train=60))
    stable = [k for k in again if "test" in k or k.startswith(("graph/", "probe/", "typing/"))]
    assert len(stable) > 10
    assert {k: bigger[k] for k in stable} == {k: again[k] for k in stable}
