"""toyworld knowledge: named toys, their facts as a graph, text that states half of them.

Every appearance toyworld can draw (shape x colour x size: 60) is a *toy* with a made-up,
pronounceable name ("Bimo"; Cyrillic "Бимо" in ru), so the image identifies the toy and a
scene's objects are all toys. Each toy has three facts, drawn independently of everything else
(only the toy's own triples tell them): ``made_of`` a material, ``owned_by`` a person,
``comes_from`` a place. Half the toys (``facts_in_text``) have their facts stated in the text
corpus; the others' facts exist only in the graph. A fourth relation, ``friend_of`` (toys in
clubs of five, every pair friends), gives the graph held-out link-prediction triples whose
answer the training triples imply (a friend of my friends).

Everything derives from the seed (:func:`build_world`); the view (:func:`write_knowledge`)
writes, under ``knowledge/``:

- ``graph/``: ``train.txt`` (every fact; FB15k-237 layout), ``valid.txt`` / ``test.txt``
  (held-out ``friend_of`` pairs, both directions), ``aliases.txt`` and ``aliases.{lang}.txt``
  (Wikidata5M ``wikidata5m_entity.txt`` layout), ``descriptions.txt`` (``wikidata5m_text.txt``
  layout: appearance and kind, never a fact), ``toys.json``, ``values.json``
- ``text/{split}-{lang}-%06d.tar``: short paragraphs about one toy each, ``json.mentions``
- ``image_text/{split}-%06d.tar``: the toyworld scenes, captions naming the toys and opening
  with one fact of a pictured toy whose facts the text states, the toy called by its
  appearance ("The red circle is made of wood."), ``regions.npz`` as the regions view and
  ``json.region_entities``
- ``probe/cloze.{lang}.jsonl``, ``typing/``, ``relations/``, ``kvqa/``: the downstream sets
  (:mod:`~mmptm.toyworld.knowledge_sets`)

Entity ids: toys ``T000``..., materials ``M00``..., persons ``P00``..., places ``L00``....

``shared_looks`` K (:data:`SHARED_LOOKS`; default 1, the world above): the toys share looks,
K toys a look, all K text toys or all graph toys, with pairwise different facts in every
relation; a scene's object shows one of its look's toys, drawn per scene
(:meth:`World.scene_toys`), and the view draws the scenes in the toys' looks
(:meth:`World.dress`). A toy's looks then narrow it down to K toys; only its entity (the
region's, or its name's mention) tells which. Look-mates share a downstream split, so a
held-out toy's look is never a training toy's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from mmptm.toyworld.language import LEXICON, _noun_phrase, definite
from mmptm.toyworld.scene import COLORS, SHAPES, SIZES, SPLITS, Obj, Scene
from mmptm.toyworld.views import _write_atomic

#: the relations the probes ask about, in the order of :data:`VALUES`
FACT_RELATIONS = ("made_of", "owned_by", "comes_from")
#: the link-prediction relation (valid/test triples), between toys
FRIEND = "friend_of"
CLUB_SIZE = 5  # friend_of: clubs of five; two disjoint pairs of each are held out
#: the downstream splits (typing, relations, kvqa) take disjoint toys: 60 / 20 / 20 %
TOY_SPLITS = ("train", "dev", "test")
#: toyworld's scene splits -> the downstream split whose toys their kvqa questions ask about
SCENE_TO_TOY_SPLIT = {"train": "train", "val": "dev", "test": "test"}
_LANGS = ("en", "de", "fr", "ru", "es")  # the order of the name columns below
_WORLD_STREAM = 11  # entropy words [seed, 11]: a world's draws never shift a scene's streams
_TEXT_STREAM = 12
#: [seed, 18]: which toys share a look, and the looks; [*scene.entropy, 18, k]: a scene's
#: looks (k 0) and toys (k 1)
_LOOKS_STREAM = 18
#: ``shared_looks`` that work: a look's toys are all text or all graph toys (30 each), and each
#: size keeps at least 4 looks with distinct (shape, colour) pairs (a scene's objects)
SHARED_LOOKS = (1, 2, 3, 5, 6)

# Value entities: names per language (en de fr ru es), then the entity type it gives a toy
# (entity typing). Single words, so a cloze [MASK] is one word in every language.
# fmt: off
VALUES: dict[str, tuple[tuple[str, ...], ...]] = {
    "made_of": (
        ("wood", "Holz", "bois", "дерево", "madera", "wooden"),
        ("plastic", "Plastik", "plastique", "пластик", "plástico", "plastic"),
        ("metal", "Metall", "métal", "металл", "metal", "metallic"),
        ("glass", "Glas", "verre", "стекло", "vidrio", "glass"),
        ("wool", "Wolle", "laine", "шерсть", "lana", "woollen"),
        ("stone", "Stein", "pierre", "камень", "piedra", "stone"),
    ),
    "owned_by": tuple(  # the same in the Latin-script languages, transliterated in ru
        (n, n, n, ru, n, kind) for n, ru, kind in (
            ("Anna", "Анна", "owned_by_adult"), ("Boris", "Борис", "owned_by_child"),
            ("Clara", "Клара", "owned_by_child"), ("David", "Давид", "owned_by_adult"),
            ("Elena", "Елена", "owned_by_adult"), ("Felix", "Феликс", "owned_by_child"),
            ("Greta", "Грета", "owned_by_child"), ("Hugo", "Гуго", "owned_by_adult"),
        )
    ),
    "comes_from": (  # consonant-initial: French "de Lima", never "d'"
        ("Bergen", "Bergen", "Bergen", "Берген", "Bergen", "local"),
        ("Porto", "Porto", "Porto", "Порту", "Oporto", "local"),
        ("Krakow", "Krakau", "Cracovie", "Краков", "Cracovia", "local"),
        ("Tampere", "Tampere", "Tampere", "Тампере", "Tampere", "local"),
        ("Lima", "Lima", "Lima", "Лима", "Lima", "imported"),
        ("Kyoto", "Kyoto", "Kyoto", "Киото", "Kioto", "imported"),
        ("Dakar", "Dakar", "Dakar", "Дакар", "Dakar", "imported"),
        ("Perth", "Perth", "Perth", "Перт", "Perth", "imported"),
        ("Quito", "Quito", "Quito", "Кито", "Quito", "imported"),
        ("Manila", "Manila", "Manille", "Манила", "Manila", "imported"),
    ),
}
# fmt: on
_VALUE_PREFIX = {"made_of": "M", "owned_by": "P", "comes_from": "L"}
_VALUE_KIND = {"made_of": "material", "owned_by": "person", "comes_from": "place"}
_DESCRIBE_VALUE = {
    "wooden": "{n} is a material.", "plastic": "{n} is a material.",
    "metallic": "{n} is a material.", "glass": "{n} is a material.",
    "woollen": "{n} is a material.", "stone": "{n} is a material.",
    "owned_by_adult": "{n} is an adult.", "owned_by_child": "{n} is a child.",
    "local": "{n} is a city in Europe.", "imported": "{n} is a city outside Europe.",
}  # fmt: skip

# Sentences. {s}: the toy's name, {o}: a value's name, {np}: the toy's appearance as
# toyworld's indefinite noun phrase. Values always stand in the nominative (Russian says
# "Материал Бимо — дерево."), toy names never inflect (they end in o, i or u, which Russian
# does not decline), so every mention is the alias as written.
# fmt: off
TEMPLATES: dict[str, dict[str, Any]] = {
    "en": {
        "made_of": ("{s} is made of {o}.", "The toy {s} is made of {o}.", "{s} was made from {o}."),
        "owned_by": ("{s} belongs to {o}.", "{s} is owned by {o}.", "The owner of {s} is {o}."),
        "comes_from": ("{s} comes from {o}.", "{s} was made in {o}.", "{s} was brought from {o}."),
        # the cloze probe's own wording: never in the training text
        "probe": {"made_of": "{s} consists of {o}.", "owned_by": "{s} is a toy of {o}.",
                  "comes_from": "{s} is originally from {o}."},
        "appearance": "{s} is {np}.",
        "neutral": ("{s} is on the shelf.", "Everyone likes {s}.", "{s} is in the toy box.",
                    "We played with {s} today."),
    },
    "de": {
        "made_of": ("{s} ist aus {o}.", "Das Spielzeug {s} ist aus {o}.",
                    "{s} wurde aus {o} gemacht."),
        "owned_by": ("{s} gehört {o}.", "{s} ist im Besitz von {o}.",
                     "{s} ist das Spielzeug von {o}."),
        "comes_from": ("{s} kommt aus {o}.", "{s} wurde in {o} gemacht.", "{s} stammt aus {o}."),
        "probe": {"made_of": "{s} besteht aus {o}.", "owned_by": "{o} besitzt {s}.",
                  "comes_from": "{s} wurde aus {o} mitgebracht."},
        "appearance": "{s} ist {np}.",
        "neutral": ("{s} steht im Regal.", "Alle mögen {s}.", "{s} liegt in der Spielzeugkiste.",
                    "Wir haben heute mit {s} gespielt."),
    },
    "fr": {
        "made_of": ("{s} est en {o}.", "Le jouet {s} est en {o}.", "{s} est fait en {o}."),
        "owned_by": ("{s} appartient à {o}.", "Le propriétaire de {s} est {o}.",
                     "{s} est le jouet de {o}."),
        "comes_from": ("{s} vient de {o}.", "{s} a été fabriqué à {o}.", "{s} arrive de {o}."),
        "probe": {"made_of": "{s} est fabriqué en {o}.", "owned_by": "{o} possède {s}.",
                  "comes_from": "{s} est originaire de {o}."},
        "appearance": "{s} est {np}.",
        "neutral": ("{s} est sur l'étagère.", "Tout le monde aime {s}.",
                    "{s} est dans le coffre à jouets.", "Nous avons joué avec {s} aujourd'hui."),
    },
    "ru": {
        "made_of": ("Материал {s} — {o}.", "У игрушки {s} материал — {o}.",
                    "{s}: материал — {o}."),
        "owned_by": ("Владелец {s} — {o}.", "У игрушки {s} владелец — {o}.",
                     "{s}: владелец — {o}."),
        "comes_from": ("Родина {s} — {o}.", "У игрушки {s} родина — {o}.", "{s}: родина — {o}."),
        "probe": {"made_of": "Материал игрушки {s} — {o}.", "owned_by": "Хозяин игрушки {s} — {o}.",
                  "comes_from": "Родной город игрушки {s} — {o}."},
        "appearance": "{s} — {np}.",
        "neutral": ("{s} стоит на полке.", "Все любят {s}.", "{s} лежит в ящике для игрушек.",
                    "Сегодня мы играли с {s}."),
    },
    "es": {
        "made_of": ("{s} es de {o}.", "El juguete {s} es de {o}.", "{s} está hecho de {o}."),
        "owned_by": ("{s} pertenece a {o}.", "El dueño de {s} es {o}.",
                     "{s} es el juguete de {o}."),
        "comes_from": ("{s} viene de {o}.", "{s} fue hecho en {o}.", "{s} llegó de {o}."),
        "probe": {"made_of": "{s} está fabricado con {o}.", "owned_by": "{o} es el dueño de {s}.",
                  "comes_from": "{s} es originario de {o}."},
        "appearance": "{s} es {np}.",
        "neutral": ("{s} está en la estantería.", "A todos les gusta {s}.",
                    "{s} está en el baúl de juguetes.", "Hoy jugamos con {s}."),
    },
}
# fmt: on

# Toy names: consonant-vowel, an optional coda, consonant, then o/i/u; letter by letter into
# Cyrillic. No c/h/j/q/w/x/y: they have no one-letter Cyrillic match.
_ONSETS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_CODAS = ("", "", "", "n", "l", "r", "s")
_ENDINGS = "oiu"
# Words these names could spell in a language not covered by the lexicons (Russian pronouns,
# everyday words, slurs): a made-up name should read as one.
# fmt: off
_AVOID = frozenset((
    "dago", "nazi", "dildo", "pussi", "pussu", "pisi", "pisu", "kaki", "kaku", "popo", "pipi",
    "peni", "nego", "nemu", "nimi", "tebe", "sebe", "delo", "nebo", "leto", "pivo", "kino",
    "milo", "seno", "rano", "telo", "solo", "vino", "sumo", "judo", "tofu", "menu", "bingo",
    "lotto", "kilo", "kiwi", "mafia", "pesto", "tuti", "tutu", "mini", "limo", "demo", "memo",
    "polo", "disco", "tango",
))
# fmt: on
_CYRILLIC = dict(zip("abdefgiklmnoprstuvz", "абдефгиклмнопрстувз"))
#: toy T{i:03d} looks like _LOOKS[i]: every (shape, colour, size)
_LOOKS = tuple((s, c, z) for s in SHAPES for c in COLORS for z in SIZES)


@dataclass(frozen=True)
class Value:
    """A value entity: a material, person or place."""

    id: str
    relation: str  # the fact relation whose tail it is
    kind: str  # material, person or place
    names: dict[str, str]  # language -> name
    type: str  # the entity type it gives a toy (entity typing)

    @property
    def description(self) -> str:
        return _DESCRIBE_VALUE[self.type].format(n=self.names["en"].capitalize())


@dataclass(frozen=True)
class Toy:
    """A named toy: its appearance (unique among toys), facts and groups."""

    id: str
    names: dict[str, str]
    shape: str
    color: str
    size: str
    facts: dict[str, str]  # relation -> value id
    facts_in_text: bool
    split: str  # its downstream split (TOY_SPLITS)
    friends: tuple[str, ...]  # its club, itself excluded

    @property
    def group(self) -> str:
        """The ``facts`` field of every item about the toy: ``text`` or ``graph``."""
        return "text" if self.facts_in_text else "graph"

    def appearance(self, lang: str) -> str:
        """Its indefinite noun phrase ("a small red circle"), as toyworld's captions say it."""
        return _noun_phrase(LEXICON[lang], Obj(self.shape, self.color, self.size, 0, 0, 0), "nom")


@dataclass(frozen=True)
class World:
    """The toys, the value entities and the ``friend_of`` triples of each graph split."""

    toys: tuple[Toy, ...]
    values: dict[str, Value]  # id -> value, in VALUES order
    friend_triples: dict[str, tuple[tuple[str, str, str], ...]]  # train / valid / test
    shared_looks: int = 1  # toys per look
    #: (shape, colour, size) -> the ids of the toys that look so (shared looks only)
    look_toys: dict[tuple[str, str, str], tuple[str, ...]] = field(default_factory=dict)

    def toy_of(self, obj: Obj) -> Toy:
        """The toy an object of a scene shows (toys are all the appearances)."""
        if self.shared_looks != 1:
            raise ValueError("with shared looks an object's toy depends on its scene: scene_toys")
        return self.toy(f"T{_LOOKS.index((obj.shape, obj.color, obj.size)):03d}")

    def dress(self, scene: Scene) -> Scene:
        """The scene as this world draws it: itself, or with shared looks each object in one
        of the toys' looks of its size (place and size kept, so the layout still holds;
        (shape, colour) pairs stay distinct, as the scenes' are)."""
        if self.shared_looks == 1:
            return scene
        rng = np.random.default_rng([*scene.entropy, _LOOKS_STREAM, 0])
        looks = {z: [k for k in self.look_toys if k[2] == z] for z in SIZES}
        objs = []
        for obj in scene.objects:
            shape, color, _ = looks[obj.size].pop(int(rng.integers(len(looks[obj.size]))))
            objs.append(replace(obj, shape=shape, color=color))
        return replace(scene, objects=tuple(objs))

    def scene_toys(self, scene: Scene) -> tuple[Toy, ...]:
        """The toy each object of a (dressed) scene shows: its look's toy, or with shared
        looks one of its look's toys, drawn for the scene."""
        if self.shared_looks == 1:
            return tuple(self.toy_of(o) for o in scene.objects)
        rng = np.random.default_rng([*scene.entropy, _LOOKS_STREAM, 1])
        ids = [self.look_toys[(o.shape, o.color, o.size)] for o in scene.objects]
        return tuple(self.toy(t[int(rng.integers(len(t)))]) for t in ids)

    def toy(self, entity: str) -> Toy:
        return self.toys[int(entity[1:])]

    def values_of(self, relation: str) -> list[Value]:
        return [v for v in self.values.values() if v.relation == relation]

    def entities(self) -> list[tuple[str, dict[str, str]]]:
        """(id, names per language) of every entity: toys, then values."""
        return [(t.id, t.names) for t in self.toys] + [
            (v.id, v.names) for v in self.values.values()
        ]

    def description(self, entity: str) -> str:
        if entity in self.values:
            return self.values[entity].description
        toy = self.toy(entity)
        return f"{toy.names['en']} is a toy, {toy.appearance('en')}."


def _known_words() -> set[str]:
    """Every lower-cased word of toyworld's lexicons and these templates: names avoid them."""
    words: set[str] = set()

    def walk(x: Any) -> None:
        if isinstance(x, str):
            words.update(w.lower() for w in re.findall(r"\w+", x))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, (tuple, list)):
            for v in x:
                walk(v)

    walk(LEXICON)
    walk(TEMPLATES)
    walk(VALUES)
    return words


def toy_names(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` distinct pronounceable names that are no word of any language used here."""
    taken = _known_words() | _AVOID
    out: list[str] = []
    while len(out) < n:
        name = "".join(
            (
                _ONSETS[rng.integers(len(_ONSETS))],
                _VOWELS[rng.integers(len(_VOWELS))],
                _CODAS[rng.integers(len(_CODAS))],
                _ONSETS[rng.integers(len(_ONSETS))],
                _ENDINGS[rng.integers(len(_ENDINGS))],
            )
        )
        if name not in taken:
            taken.add(name)
            out.append(name.capitalize())
    return out


def transliterate(name: str) -> str:
    """A toy name in Cyrillic, letter by letter ("Bimo" -> "Бимо")."""
    return "".join(_CYRILLIC[c] for c in name.lower()).capitalize()


def _balanced(rng: np.random.Generator, k: int, n: int) -> np.ndarray:
    """``n`` draws from ``range(k)``, each value ⌊n/k⌋ or ⌈n/k⌉ times, in random order: any
    constant guess is right for 1/k of the items (± one item per value)."""
    return rng.permutation(np.resize(rng.permutation(k), n))


@lru_cache(maxsize=4)
def build_world(seed: int, shared_looks: int = 1) -> World:
    """The toys, their names and facts, drawn from ``seed`` alone; ``shared_looks``: toys
    per look (:data:`SHARED_LOOKS`; the same toys, names and facts in other looks)."""
    if shared_looks not in SHARED_LOOKS:
        raise ValueError(f"shared_looks must be one of {SHARED_LOOKS}, got {shared_looks}")
    rng = np.random.default_rng([seed, _WORLD_STREAM])
    values: dict[str, Value] = {}
    for relation, rows in VALUES.items():
        for i, row in enumerate(rows):
            vid = f"{_VALUE_PREFIX[relation]}{i:02d}"
            values[vid] = Value(
                vid, relation, _VALUE_KIND[relation], dict(zip(_LANGS, row)), row[-1]
            )
    looks = _LOOKS
    n = len(looks)
    names = toy_names(rng, n)
    in_text = np.zeros(n, bool)
    in_text[rng.permutation(n)[: n // 2]] = True
    # facts and downstream splits: balanced within each group, so chance is the same in both
    facts: list[dict[str, str]] = [{} for _ in range(n)]
    split = [""] * n
    for group in (True, False):
        members = np.flatnonzero(in_text == group)
        for relation, rows in VALUES.items():
            for toy, v in zip(members, _balanced(rng, len(rows), len(members))):
                facts[toy][relation] = f"{_VALUE_PREFIX[relation]}{int(v):02d}"
        order = rng.permutation(members)
        cut = (round(0.6 * len(order)), round(0.8 * len(order)))
        for part, toys in zip(TOY_SPLITS, np.split(order, cut)):
            for toy in toys:
                split[int(toy)] = part
    ids = [f"T{i:03d}" for i in range(n)]
    clubs = np.split(rng.permutation(n), range(CLUB_SIZE, n, CLUB_SIZE))
    friends = {i: tuple(ids[int(j)] for c in clubs if i in c for j in sorted(c) if j != i)
               for i in range(n)}  # fmt: skip
    triples: dict[str, list[tuple[str, str, str]]] = {"train": [], "valid": [], "test": []}
    for club in clubs:
        held = {}
        if len(club) >= 4:  # two disjoint pairs: each keeps common friends in training
            held = {frozenset(club[:2].tolist()): "valid", frozenset(club[2:4].tolist()): "test"}
        for a in sorted(club.tolist()):
            for b in sorted(club.tolist()):
                if a != b:
                    part = held.get(frozenset((a, b)), "train")
                    triples[part].append((ids[a], FRIEND, ids[b]))
    toys = tuple(
        Toy(
            id=ids[i],
            names={lang: transliterate(names[i]) if lang == "ru" else names[i] for lang in _LANGS},
            shape=looks[i][0],
            color=looks[i][1],
            size=looks[i][2],
            facts=facts[i],
            facts_in_text=bool(in_text[i]),
            split=split[i],
            friends=friends[i],
        )
        for i in range(n)
    )
    world = World(toys, values, {k: tuple(v) for k, v in triples.items()})
    return world if shared_looks == 1 else _share_looks(world, seed, shared_looks)


def _share_looks(world: World, seed: int, k: int) -> World:
    """``world`` with its toys ``k`` to a look (:func:`build_world`): groups of text toys
    and of graph toys, facts pairwise different in each; the looks' (shape, colour) pairs
    distinct, sizes alternating; the downstream splits drawn by look (60 / 20 / 20 % of each
    group's looks), so look-mates share one."""
    rng = np.random.default_rng([seed, _LOOKS_STREAM])
    groups = [g for in_text in (True, False)
              for g in _unlike_groups(rng, [t for t in world.toys if t.facts_in_text == in_text],
                                      k)]  # fmt: skip
    pairs = rng.permutation(len(SHAPES) * len(COLORS))[: len(groups)]
    colors, sizes = list(COLORS), list(SIZES)
    looks = [(SHAPES[int(p) // len(colors)], colors[int(p) % len(colors)], sizes[i % len(sizes)])
             for i, p in enumerate(pairs)]  # fmt: skip
    look_of = {t.id: look for look, g in zip(looks, groups) for t in g}
    # a look's toys share a downstream split: a held-out toy's look is held out with it, so
    # a head fine-tuned on the training toys' looks cannot answer a test toy by its look-mates
    split_of = {}
    for in_text in (True, False):
        mine = [g for g in groups if g[0].facts_in_text == in_text]
        order = rng.permutation(len(mine))
        cut = (round(0.6 * len(mine)), round(0.8 * len(mine)))
        for part, members in zip(TOY_SPLITS, np.split(order, cut)):
            split_of |= {t.id: part for i in members for t in mine[int(i)]}
    toys = tuple(replace(t, shape=look_of[t.id][0], color=look_of[t.id][1],
                         size=look_of[t.id][2], split=split_of[t.id])
                 for t in world.toys)  # fmt: skip
    look_toys = {look: tuple(t.id for t in g) for look, g in zip(looks, groups)}
    return replace(world, toys=toys, shared_looks=k, look_toys=look_toys)


def _unlike_groups(rng: np.random.Generator, toys: list[Toy], k: int) -> list[list[Toy]]:
    """``toys`` in groups of ``k`` whose facts differ pairwise in every relation (greedy over
    random orders until one works)."""
    for _ in range(10_000):
        left = [toys[int(i)] for i in rng.permutation(len(toys))]
        groups: list[list[Toy]] = []
        while left:
            group = [left.pop(0)]
            for toy in list(left):
                if len(group) < k and all(toy.facts[r] != g.facts[r] for g in group
                                          for r in FACT_RELATIONS):  # fmt: skip
                    group.append(toy)
                    left.remove(toy)
            if len(group) < k:
                break
            groups.append(group)
        else:
            return groups
    raise ValueError(f"no grouping of {len(toys)} toys by {k} with different facts")


# ---------------------------------------------------------------------------------------------
# Sentences with their mentions

Mention = list  # [start, end, entity id], as json gives it back
_SLOT = re.compile(r"\{(\w+)\}")


def fill(template: str, slots: dict[str, tuple[str, str | None]]) -> tuple[str, list[Mention]]:
    """``template`` with each ``{slot}`` replaced by its text; the mentions of the slots that
    name an entity (``(text, id)``; id None: plain text), as character offsets."""
    parts, mentions, pos = [], [], 0
    for m in _SLOT.finditer(template):
        parts.append(template[pos : m.start()])
        text, entity = slots[m.group(1)]
        start = sum(len(p) for p in parts)
        parts.append(text)
        if entity is not None:
            mentions.append([start, start + len(text), entity])
        pos = m.end()
    parts.append(template[pos:])
    return "".join(parts), mentions


def fact_sentence(
    world: World, toy: Toy, relation: str, template: str, lang: str
) -> tuple[str, list[Mention]]:
    value = world.values[toy.facts[relation]]
    slots = {"s": (toy.names[lang], toy.id), "o": (value.names[lang], value.id)}
    return fill(template, slots)


def neutral_sentence(toy: Toy, which: int, lang: str) -> tuple[str, list[Mention]]:
    """Sentence ``which`` of the toy's neutral ones: 0 its appearance, then TEMPLATES' neutral."""
    t = TEMPLATES[lang]
    template = t["appearance"] if which == 0 else t["neutral"][which - 1]
    return fill(template, {"s": (toy.names[lang], toy.id), "np": (toy.appearance(lang), None)})


#: the TEMPLATES row a caption states a pictured toy's fact with: one that opens with the
#: subject in the nominative (Russian's first two put it in the genitive)
_PICTURED_TEMPLATE = {"ru": 2}


def pictured_fact_sentence(
    world: World, obj: Obj, relation: str, lang: str, value: str | None = None
) -> tuple[str, tuple[int, int]]:
    """A fact of the toy ``obj`` shows, the toy called by its appearance in the scene ("The red
    circle is made of wood.", a definite phrase unique in a scene): the toy has no name and no
    mention there, so a model can tie the fact to it only through the image. Returns the
    sentence and the value's character span (its mention in a caption). ``value``: another
    value id in its place (the visual cloze's candidates); default the toy's own."""
    value_id = value or world.toy_of(obj).facts[relation]
    template = TEMPLATES[lang][relation][_PICTURED_TEMPLATE.get(lang, 0)]
    subject = definite(obj, lang)
    slots = {"s": (subject, None), "o": (world.values[value_id].names[lang], value_id)}
    text, ((start, end, _),) = fill(template, slots)
    return text[0].upper() + text[1:], (start, end)


N_NEUTRAL = 1 + len(TEMPLATES["en"]["neutral"])
_FACT_P = 2 / 3  # share of a text toy's sentences that state a fact


def text_sample(world: World, split: str, index: int, seed: int) -> list[tuple[str, Any]]:
    """Sample ``index`` of a text split, language-independent: one toy, 2-3 sentences, each
    ``("fact", relation, template index)`` (text toys only) or ``("neutral", which)``."""
    rng = np.random.default_rng([seed, SPLITS[split], index, _TEXT_STREAM])
    toy = world.toys[int(rng.integers(len(world.toys)))]
    plan: list[tuple[str, Any]] = [("toy", toy.id)]
    for _ in range(int(rng.integers(2, 4))):
        if toy.facts_in_text and rng.random() < _FACT_P:
            relation = FACT_RELATIONS[int(rng.integers(len(FACT_RELATIONS)))]
            plan.append(("fact", (relation, int(rng.integers(3)))))
        else:
            plan.append(("neutral", int(rng.integers(N_NEUTRAL))))
    return plan


def render_text(world: World, plan: list[tuple[str, Any]], lang: str) -> tuple[str, list[Mention]]:
    """A :func:`text_sample` in one language: its text and mentions."""
    toy = world.toy(plan[0][1])
    text, mentions = "", []
    for kind, arg in plan[1:]:
        if kind == "fact":
            relation, k = arg
            sentence, found = fact_sentence(
                world, toy, relation, TEMPLATES[lang][relation][k], lang
            )
        else:
            sentence, found = neutral_sentence(toy, arg, lang)
        offset = len(text) + (1 if text else 0)
        text = f"{text} {sentence}" if text else sentence
        mentions += [[s + offset, e + offset, entity] for s, e, entity in found]
    return text, mentions


def caption_mentions(caption: str, names: dict[str, str]) -> list[Mention]:
    """Where each toy name (id -> name) stands in a caption, in text order."""
    found = []
    for entity, name in names.items():
        for m in re.finditer(rf"(?<!\w){re.escape(name)}(?!\w)", caption):
            found.append([m.start(), m.end(), entity])
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# The graph files


def graph_files(world: World, languages: Sequence[str]) -> dict[str, str]:
    """File name -> content of ``knowledge/graph/``."""

    def tsv(rows: Sequence[Sequence[str]]) -> str:
        return "".join("\t".join(r) + "\n" for r in rows)

    facts = [(t.id, r, t.facts[r]) for t in world.toys for r in FACT_RELATIONS]
    files = {
        "train.txt": tsv(facts + list(world.friend_triples["train"])),
        "valid.txt": tsv(world.friend_triples["valid"]),
        "test.txt": tsv(world.friend_triples["test"]),
        "aliases.txt": tsv(
            [
                (e, *dict.fromkeys(names[lang] for lang in languages))
                for e, names in world.entities()
            ]
        ),
        "descriptions.txt": tsv([(e, world.description(e)) for e, _ in world.entities()]),
    }
    for lang in languages:
        files[f"aliases.{lang}.txt"] = tsv([(e, names[lang]) for e, names in world.entities()])
    toys = [
        {
            "id": t.id,
            "names": {lang: t.names[lang] for lang in languages},
            "shape": t.shape,
            "color": t.color,
            "size": t.size,
            "facts": t.facts,
            "fact_names": {
                r: {lang: world.values[v].names[lang] for lang in languages}
                for r, v in t.facts.items()
            },
            "facts_in_text": t.facts_in_text,
            "split": t.split,
            "friends": list(t.friends),
        }
        for t in world.toys
    ]
    values = [
        {"id": v.id, "kind": v.kind, "relation": v.relation, "type": v.type,
         "names": {lang: v.names[lang] for lang in languages}}
        for v in world.values.values()
    ]  # fmt: skip
    files["toys.json"] = json.dumps(toys, indent=1, ensure_ascii=False) + "\n"
    files["values.json"] = json.dumps(values, indent=1, ensure_ascii=False) + "\n"
    return files


def knowledge_manifest(seed: int, shared_looks: int = 1) -> dict[str, Any]:
    """The manifest's ``knowledge`` section: sizes, relations and chance levels (and
    ``shared_looks`` when not 1)."""
    world = build_world(seed, shared_looks)
    n_values = {r: len(VALUES[r]) for r in FACT_RELATIONS}
    return {
        **({"shared_looks": shared_looks} if shared_looks != 1 else {}),
        "root": "knowledge",
        "toys": len(world.toys),
        "facts_in_text": sum(t.facts_in_text for t in world.toys),
        "relations": {**n_values, FRIEND: "link prediction (valid.txt, test.txt)"},
        "entity_prefixes": {"toy": "T", **{_VALUE_KIND[r]: p for r, p in _VALUE_PREFIX.items()}},
        "cloze_chance": {r: 1 / k for r, k in n_values.items()},
        "graph_triples": {
            "train": len(world.toys) * len(FACT_RELATIONS) + len(world.friend_triples["train"]),
            "valid": len(world.friend_triples["valid"]),
            "test": len(world.friend_triples["test"]),
        },
        "toy_splits": {s: sum(t.split == s for t in world.toys) for s in TOY_SPLITS},
    }


def write_files(folder: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        _write_atomic(folder / name, content)
