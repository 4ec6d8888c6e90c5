"""The downstream sets of toyworld knowledge, and the ``knowledge`` view that writes it all.

Every set asks about the toys' facts in a frame that does not state them, so the answer needs
knowledge; every item carries ``facts`` (``text``: the toy's facts are in the text corpus,
``graph``: only in the graph). Typing, relation classification and knowledge VQA split by toy
(:data:`~mmptm.toyworld.knowledge.TOY_SPLITS`, both groups in each): a model fine-tuned
on the train toys cannot learn a test toy's facts from the fine-tuning labels, only from the
text it was pre-trained on or from the graph.

- ``probe/cloze.{lang}.jsonl``: LAMA T-REx lines, one per (toy, relation), every toy;
  ``masked_sentences[0]`` in a wording the training text never uses, ``[1]`` in one it does
- ``typing/{train,dev,test}.json``: Open Entity lines (English): a neutral sentence naming
  the toy, types ``toy`` + its material's (``wooden``...), its owner's (``owned_by_child`` /
  ``owned_by_adult``) and its place's (``local`` / ``imported``)
- ``relations/{train,dev,test}.json``: TACRED lists (English): a toy and a value in a neutral
  frame; the relation when the value is the toy's fact, else ``no_relation`` (half and half)
- ``kvqa/``: VQA v2 files and ``{split}-%06d.tar`` (``jpg``, ``regions.npz``, ``json``):
  "What is the toy on the left made of?", asked about toys of the scene split's toy split
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmptm.toyworld.detector import _detections
from mmptm.toyworld.knowledge import (
    FACT_RELATIONS,
    SCENE_TO_TOY_SPLIT,
    TEMPLATES,
    TOY_SPLITS,
    Toy,
    World,
    build_world,
    caption_mentions,
    fill,
    graph_files,
    pictured_fact_sentence,
    render_text,
    text_sample,
    write_files,
)
from mmptm.toyworld.language import describe
from mmptm.toyworld.scene import Obj, Scene
from mmptm.toyworld.views import ViewOutput, ViewSettings, _primary, _records, drop_stale
from mmptm.toyworld.vqa import VqaQuestion, _annotate, _vqa_files, qa_record, vqa_file_names

_SETS_STREAM = 13  # [seed, 13, k]: typing and relation draws
_KVQA_STREAM = 14  # [*scene.entropy, 14]
_CAPTION_FACT_STREAM = 15  # [*scene.entropy, 15]: which pictured toy's fact a caption states
MASK = "[MASK]"

# fmt: off
TYPING_FRAMES = (
    "Yesterday {s} was on the shelf.", "{s} fell off the table.",
    "We played with {s} all afternoon.", "{s} was found under the bed.",
    "Someone left {s} in the garden.", "{s} is in the big box.",
    "My sister put {s} on the chair.", "{s} was lost for a week.",
    "Look at {s} over there.", "{s} sat by the window.",
    "The cat knocked {s} over.", "{s} was packed for the trip.",
)
RELATION_FRAMES = (
    "{s} and {o} were in the box.", "The story mentions {s} and {o}.",
    "{o} and {s} were on the list.", "We talked about {s} and {o} today.",
)
# fmt: on
_OBJ_TYPE = {"made_of": "MATERIAL", "owned_by": "PERSON", "comes_from": "PLACE"}
_KVQA_ASK = {
    "made_of": ("What is {ref} made of?", "what is made of"),
    "owned_by": ("Who owns {ref}?", "who owns"),
    "comes_from": ("Where does {ref} come from?", "where does come from"),
}
_SIDE_GAP = 0.15  # "the toy on the left": only this much further left than the next one


def _tokens(template: str, slots: dict[str, str]) -> tuple[list[str], dict[str, int]]:
    """Words and punctuation of a filled template, and the token index of each slot (names
    and values are one word)."""
    tokens: list[str] = []
    where: dict[str, int] = {}
    pos = 0
    for m in re.finditer(r"\{(\w+)\}", template):
        tokens += re.findall(r"\w+|[^\w\s]", template[pos : m.start()])
        where[m.group(1)] = len(tokens)
        tokens.append(slots[m.group(1)])
        pos = m.end()
    tokens += re.findall(r"\w+|[^\w\s]", template[pos:])
    return tokens, where


def _lama(sentence: str) -> str:
    """LAMA's spacing: the final full stop a token of its own ("... [MASK] .")."""
    return sentence[:-1].rstrip() + " ." if sentence.endswith(".") else sentence


def cloze_lines(world: World, lang: str) -> list[dict[str, Any]]:
    """One LAMA T-REx line per (toy, relation) in one language."""
    lines = []
    for toy in world.toys:
        for relation in FACT_RELATIONS:
            value = world.values[toy.facts[relation]]
            slots = {"s": (toy.names[lang], None), "o": (MASK, None)}
            wordings = (TEMPLATES[lang]["probe"][relation], TEMPLATES[lang][relation][0])
            lines.append(
                {
                    "uuid": f"{toy.id}_{relation}_{lang}",
                    "sub_uri": toy.id,
                    "sub_label": toy.names[lang],
                    "obj_uri": value.id,
                    "obj_label": value.names[lang],
                    "predicate_id": relation,
                    "masked_sentences": [_lama(fill(t, slots)[0]) for t in wordings],
                    "facts": toy.group,
                    "language": lang,
                }
            )
    return lines


def toy_types(world: World, toy: Toy) -> list[str]:
    """The entity types of a toy: ``toy`` and one per fact (its value's type)."""
    return ["toy", *(world.values[toy.facts[r]].type for r in FACT_RELATIONS)]


def _by_split(world: World, items: list[tuple[Toy, dict[str, Any]]], seed: int, k: int) -> dict:
    """Items grouped by their toy's split, each split shuffled (Open Entity and TACRED files
    are not sorted by entity)."""
    rng = np.random.default_rng([seed, _SETS_STREAM, k])
    out = {}
    for split in TOY_SPLITS:
        mine = [item for toy, item in items if toy.split == split]
        out[split] = [mine[int(i)] for i in rng.permutation(len(mine))]
    return out


def typing_items(world: World, seed: int) -> dict[str, list[dict[str, Any]]]:
    """Open Entity lines per split: every toy in every frame of :data:`TYPING_FRAMES`."""
    items = []
    for toy in world.toys:
        for frame in TYPING_FRAMES:
            tokens, where = _tokens(frame, {"s": toy.names["en"]})
            i = where["s"]
            item = {
                "left_context_token": tokens[:i],
                "mention_span": toy.names["en"],
                "right_context_token": tokens[i + 1 :],
                "y_str": toy_types(world, toy),
                "entity": toy.id,
                "facts": toy.group,
            }
            items.append((toy, item))
    return _by_split(world, items, seed, 0)


def relation_items(world: World, seed: int) -> dict[str, list[dict[str, Any]]]:
    """TACRED items per split: per toy and relation its value and one other value (labelled
    ``no_relation``), each in two of :data:`RELATION_FRAMES`."""
    rng = np.random.default_rng([seed, _SETS_STREAM, 1])
    items = []
    for toy in world.toys:
        for relation in FACT_RELATIONS:
            true = toy.facts[relation]
            others = [v.id for v in world.values_of(relation) if v.id != true]
            wrong = others[int(rng.integers(len(others)))]
            for value_id, label in ((true, relation), (wrong, "no_relation")):
                value = world.values[value_id]
                for f in rng.permutation(len(RELATION_FRAMES))[:2]:
                    slots = {"s": toy.names["en"], "o": value.names["en"]}
                    tokens, where = _tokens(RELATION_FRAMES[int(f)], slots)
                    item = {
                        "id": f"{toy.id}_{value.id}_{int(f)}",
                        "token": tokens,
                        "subj_start": where["s"],
                        "subj_end": where["s"],
                        "obj_start": where["o"],
                        "obj_end": where["o"],
                        "subj_type": "TOY",
                        "obj_type": _OBJ_TYPE[relation],
                        "relation": label,
                        "subj_id": toy.id,
                        "obj_id": value.id,
                        "facts": toy.group,
                    }
                    items.append((toy, item))
    return _by_split(world, items, seed, 2)


def _references(objs: Sequence[Obj], i: int) -> list[str]:
    """Ways to name object ``i`` that no other object of the scene fits."""
    o = objs[i]
    refs = [f"the {o.color} {o.shape}"]  # a scene's (colour, shape) pairs are distinct
    if sum(p.size == o.size and p.shape == o.shape for p in objs) == 1:
        refs.append(f"the {o.size} {o.shape}")
    if sum(p.color == o.color for p in objs) == 1:
        refs.append(f"the {o.color} toy")
    if len(objs) > 1 and i == 0 and objs[1].x - o.x >= _SIDE_GAP:
        refs.append("the toy on the left")
    if len(objs) > 1 and i == len(objs) - 1 and o.x - objs[-2].x >= _SIDE_GAP:
        refs.append("the toy on the right")
    return refs


def kvqa_questions(world: World, scene: Scene) -> list[tuple[VqaQuestion, dict[str, Any]]]:
    """Up to two questions about toys of the scene's toy split, with ten annotators' answers
    (English value names, lower case as VQA's), and what they ask (entity, relation,
    region, answer entity, facts)."""
    rng = np.random.default_rng([*scene.entropy, _KVQA_STREAM])
    objs, toys = scene.objects, world.scene_toys(scene)
    split = SCENE_TO_TOY_SPLIT[scene.split]
    asked = [i for i, t in enumerate(toys) if t.split == split]
    out = []
    for k, i in enumerate(rng.permutation(asked)[:2].tolist()):
        toy = toys[i]
        relation = FACT_RELATIONS[int(rng.integers(len(FACT_RELATIONS)))]
        refs = _references(objs, i)
        template, question_type = _KVQA_ASK[relation]
        question = template.format(ref=refs[int(rng.integers(len(refs)))])
        value = world.values[toy.facts[relation]]
        answer = value.names["en"].lower()
        mistakes = [v.names["en"].lower() for v in world.values_of(relation) if v != value]
        posed = (question, answer, "other", question_type, mistakes, ())
        answers, confidences = _annotate(rng, posed)
        q = VqaQuestion(scene.index * 10 + k, question, answer, "other", question_type,
                        tuple(answers), tuple(confidences))  # fmt: skip
        about = {"entity": toy.id, "relation": relation, "answer_entity": value.id,
                 "region": i, "facts": toy.group}  # fmt: skip
        out.append((q, about))
    return out


def _names(world: World, scene: Scene, lang: str) -> dict[str, str]:
    return {t.id: t.names[lang] for t in world.scene_toys(scene)}


def caption_fact(world: World, scene: Scene) -> dict[str, Any] | None:
    """The fact a scene's captions state: of a random pictured toy whose facts the text states
    (None when the scene shows none; a graph-only toy's facts stay in the graph), a random
    relation: ``region``, ``entity``, ``relation``, ``answer_entity``."""
    rng = np.random.default_rng([*scene.entropy, _CAPTION_FACT_STREAM])
    toys = world.scene_toys(scene)
    told = [i for i, t in enumerate(toys) if t.facts_in_text]
    if not told:
        return None
    i = told[int(rng.integers(len(told)))]
    relation = FACT_RELATIONS[int(rng.integers(len(FACT_RELATIONS)))]
    toy = toys[i]
    return {"region": i, "entity": toy.id, "relation": relation,
            "answer_entity": toy.facts[relation]}  # fmt: skip


def scene_sample_json(world: World, scene: Scene, record: dict, languages: Sequence[str]) -> dict:
    """The image_text record of a scene: captions that open with :func:`caption_fact` (the
    toy called by its appearance: a masked value word there can only be recovered through the
    image, from the region's entity, which is what knowledge VQA asks) and then name the toys;
    their mentions (the fact's value, then the toys' names; the pictured toy is no mention),
    the fact (``caption_fact``), the toy of each object (``toys``, = ``region_entities``:
    regions are the objects, in order)."""
    toys = world.scene_toys(scene)
    fact = caption_fact(world, scene)
    captions, mentions = {}, {}
    for lang in languages:
        caption = describe(scene, lang, [t.names[lang] for t in toys])
        opening: list[list] = []
        if fact is not None:
            obj = scene.objects[fact["region"]]
            sentence, (a, b) = pictured_fact_sentence(
                world, obj, fact["relation"], lang, fact["answer_entity"]
            )
            caption = f"{sentence} {caption}"
            opening = [[a, b, fact["answer_entity"]]]
        captions[lang] = caption
        mentions[lang] = opening + caption_mentions(caption, _names(world, scene, lang))
    ids = [t.id for t in toys]
    return {**record, "captions": captions, "mentions": mentions, "toys": ids,
            "region_entities": ids, "caption_fact": fact}  # fmt: skip


def _jsonl(items: Sequence[dict]) -> str:
    return "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items)


def _drop_other_languages(folder: Path, pattern: str, keep: set[str]) -> None:
    """Remove per-language files an earlier run with other languages left (``pattern``: a
    glob whose second dot-separated part is the language)."""
    for old in folder.glob(pattern):
        if old.name.split(".")[1] not in keep:
            old.unlink()


def write_knowledge(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """The knowledge view (module docstrings): graph and downstream files once (with train),
    text, image_text and kvqa shards per split."""
    world = build_world(cfg.seed, cfg.shared_looks)
    scenes = [world.dress(s) for s in scenes]  # shared looks: the objects in the toys' looks
    root, split = out.root, out.split
    if split == "train":
        write_files(root / "graph", graph_files(world, cfg.languages))
        _drop_other_languages(root / "graph", "aliases.*.txt", set(cfg.languages))
        clozes = {f"cloze.{lang}.jsonl": _jsonl(cloze_lines(world, lang)) for lang in cfg.languages}
        write_files(root / "probe", clozes)
        _drop_other_languages(root / "probe", "cloze.*.jsonl", set(cfg.languages))
        typing = typing_items(world, cfg.seed)
        write_files(root / "typing", {f"{s}.json": _jsonl(typing[s]) for s in TOY_SPLITS})
        rels = relation_items(world, cfg.seed)
        write_files(
            root / "relations",
            {f"{s}.json": json.dumps(rels[s], ensure_ascii=False) + "\n" for s in TOY_SPLITS},
        )
    text = ViewOutput(root / "text", split, out.shard_size)
    for lang in cfg.languages:
        with text.writer(lang) as writer:
            for scene in scenes:
                plan = text_sample(world, split, scene.index, cfg.seed)
                txt, mentions = render_text(world, plan, lang)
                meta = {"language": lang, "mentions": mentions, "toys": [plan[0][1]]}
                writer.write({"__key__": f"{scene.key}_{lang}", "txt": txt, "json": meta})
        out.add(f"text-{lang}", text.shards[lang], text.samples[lang])
    primary = _primary(cfg)
    media = _detections(tuple(scenes), cfg.image_size)
    records = _records(tuple(scenes), cfg.image_size, cfg.languages)
    image_text = ViewOutput(root / "image_text", split, out.shard_size)
    with image_text.writer() as writer:
        for scene, (jpg, npz), record in zip(scenes, media, records):
            meta = scene_sample_json(world, scene, record, cfg.languages)
            sample = {"__key__": scene.key, "jpg": jpg, "txt": meta["captions"][primary]}
            writer.write({**sample, "json": meta, "regions.npz": npz})
    out.add("image_text", image_text.shards[None], image_text.samples[None])
    kvqa = ViewOutput(root / "kvqa", split, out.shard_size)
    items = [(s, q, about) for s in scenes for q, about in kvqa_questions(world, s)]
    files = _vqa_files(split, [(s, q) for s, q, _ in items])
    names = vqa_file_names(split)
    write_files(
        root / "kvqa", {n: json.dumps(c, ensure_ascii=False) + "\n" for n, c in zip(names, files)}
    )
    media_of = dict(zip((s.key for s in scenes), media))
    with kvqa.writer() as writer:
        for scene, q, about in items:
            jpg, npz = media_of[scene.key]
            ids = [t.id for t in world.scene_toys(scene)]
            record = qa_record(q, ("image_id", scene.index), **about, region_entities=ids)
            writer.write({"__key__": str(q.question_id), "jpg": jpg, "regions.npz": npz,
                          "json": record})  # fmt: skip
    out.add("kvqa", kvqa.shards[None], kvqa.samples[None])
    for sub in (text, image_text, kvqa):
        drop_stale(sub.root, split, {Path(p) for paths in sub.shards.values() for p in paths})


KNOWLEDGE_VIEWS = {"knowledge": write_knowledge}
