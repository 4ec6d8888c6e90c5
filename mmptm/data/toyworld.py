"""toyworld: the embedded default data set, generated from a seed instead of downloaded.

A *scene* is a handful of coloured shapes on a light background. The pipeline is kept in
separate stages so later views (VQA, detector features, video, sound, knowledge graph) can be
added without touching the others::

    sample_scene (layout) -> render (pixels) -> describe (captions) -> VIEWS (shard writers)

Views, each written for every split and requested language:

- ``image_text``: img2dataset-style ``jpg`` + ``txt`` + ``json`` (annotations, all captions)
- ``parallel``: one sample per scene and language pair, ``json`` = {languages, texts}
- ``mono``: monolingual text, one shard set per language: ``mono/{split}-{lang}-%06d.tar``
- ``nli``: premise (caption of the first k objects) / hypothesis (one claim about an object)
  pairs labelled entailment, neutral or contradiction, translations sharing a pair id.
  Written as the real corpora ship (XNLI 1.0 TSV; MultiNLI and XNLI-MT translate-train
  TSVs for train), then converted to ``nli/{split}-{lang}-%06d.tar`` by
  :func:`mmptm.data.converters.convert_xnli`.

Every scene draws from ``numpy.random.default_rng([seed, split_code, index])``, so a scene
depends only on its own coordinates: growing ``n_train`` leaves val/test unchanged, and the
same arguments give byte-identical shards.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from mmptm.data.converters import XNLI_COLUMNS, convert_xnli
from mmptm.data.shards import ShardWriter

__all__ = [
    "COLORS",
    "GENERATOR_VERSION",
    "LANGUAGES",
    "LEXICON",
    "LOCATIONS",
    "NLI_LABELS",
    "OPPOSITE",
    "RELATIONS",
    "SHAPES",
    "SIZES",
    "SPLITS",
    "VIEWS",
    "Claim",
    "NliPair",
    "Obj",
    "Scene",
    "ViewOutput",
    "ViewSettings",
    "captions",
    "describe",
    "encode_jpeg",
    "generate",
    "lexicon_forms",
    "location",
    "nli_pairs",
    "nli_text",
    "object_box",
    "relation",
    "relations",
    "render",
    "sample_scene",
    "scene_record",
    "state",
]

# Bump whenever the same arguments would produce different bytes.
# 2: views mono and nli (image_text, parallel and text/ unchanged since 1).
GENERATOR_VERSION = 2

SPLITS = {"train": 0, "val": 1, "test": 2}
SHAPES = ("circle", "square", "triangle", "diamond", "star")
# Saturated and far apart in RGB, so a JPEG'd 64 px image still shows which is which.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 200, 20),
    "purple": (140, 40, 170),
    "orange": (245, 130, 20),
}
# Circumradius as a fraction of the image side; a 2x ratio is obvious whatever the shape.
SIZES: dict[str, float] = {"small": 0.07, "large": 0.14}
RELATIONS = ("left_of", "right_of", "above", "below")
# fmt: off
LOCATIONS = (  # the 3x3 grid, row by row
    "top_left", "top", "top_right",
    "left", "middle", "right",
    "bottom_left", "bottom", "bottom_right",
)
# fmt: on

BACKGROUND = (236, 236, 230)
NOISE = 5  # +- grey levels of per-pixel noise
JPEG_QUALITY = 90
N_OBJECTS_P = (0.1, 0.3, 0.3, 0.3)  # P(1..4 objects); few singles keeps captions unique
EDGE = 0.02  # min free border between a shape and the image edge
GAP = 0.06  # min free space between two shapes' circumcircles
DOMINANCE = 1.5  # a stated relation's axis offset is >= this times the other axis offset
GRID_MARGIN = 0.06  # a lone object stays this far from the 3x3 grid lines
SUPERSAMPLE = 4  # draw larger, then box-filter down: cheap anti-aliasing
_MAX_TRIES = 10_000
_RENDER_STREAM = 1  # extra entropy word: render noise never shifts the layout stream


def _unit(vertices: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Centre a polygon's bounding box on the origin and scale its circumradius to 1.

    Box centre == object centre, and every shape fits in its circle of radius ``r``.
    """
    v = np.asarray(vertices, dtype=np.float64)
    v = v - (v.min(0) + v.max(0)) / 2
    v = v / np.linalg.norm(v, axis=1).max()
    return tuple((float(x), float(y)) for x, y in v)


def _star(points: int = 5, inner: float = 0.45) -> list[tuple[float, float]]:
    angles = np.pi * np.arange(2 * points) / points - np.pi / 2
    radii = np.where(np.arange(2 * points) % 2 == 0, 1.0, inner)
    return list(zip(radii * np.cos(angles), radii * np.sin(angles)))


# Unit polygons in image orientation (y grows downwards); None = circle.
_POLYGONS: dict[str, tuple[tuple[float, float], ...] | None] = {
    "circle": None,
    "square": _unit([(-1, -1), (1, -1), (1, 1), (-1, 1)]),
    "triangle": _unit([(0, -1), (1, 1), (-1, 1)]),
    "diamond": _unit([(0, -1), (1, 0), (0, 1), (-1, 0)]),
    "star": _unit(_star()),
}
# Half width and half height of each shape's box, in units of r.
_HALF_EXTENT = {
    s: (1.0, 1.0) if p is None else (max(x for x, _ in p), max(y for _, y in p))
    for s, p in _POLYGONS.items()
}


# ---------------------------------------------------------------------------------------------
# Lexicons. A form entry is a string (invariable) or a dict keyed "gender.case", "case" or
# "gender" (looked up in that order). Nouns are (gender, forms).


def _de_adj(stem: str) -> dict[str, str]:
    """German mixed declension (after "ein"), nominative and dative."""
    nom = {"m": "er", "f": "e", "n": "es"}
    return {
        **{f"{g}.nom": stem + e for g, e in nom.items()},
        **{f"{g}.dat": stem + "en" for g in nom},
    }


_RU_ENDINGS = {  # m.nom m.gen m.ins f.nom f.gen f.ins
    "hard": ("ый", "ого", "ым", "ая", "ой", "ой"),
    "soft": ("ий", "его", "им", "яя", "ей", "ей"),
    "velar": ("ий", "ого", "им", "ая", "ой", "ой"),
    "stressed": ("ой", "ого", "им", "ая", "ой", "ой"),
}


def _de_weak(stem: str) -> dict[str, str]:
    """German weak declension (after "der"), nominative and dative: the same for all genders."""
    return {"nom": stem + "e", "dat": stem + "en"}


_DE_COLORS = {"red": "rot", "green": "grün", "blue": "blau", "yellow": "gelb",
              "purple": "violett", "orange": "orangefarben"}  # fmt: skip


def _ru_adj(stem: str, paradigm: str) -> dict[str, str]:
    """Russian adjective forms for the cases the grammar uses."""
    keys = ("m.nom", "m.gen", "m.ins", "f.nom", "f.gen", "f.ins")
    return {k: stem + e for k, e in zip(keys, _RU_ENDINGS[paradigm])}


def _ru_noun(nom: str, gen: str, ins: str) -> dict[str, str]:
    return {"nom": nom, "gen": gen, "ins": ins}


# fmt: off
LEXICON: dict[str, dict[str, Any]] = {
    "en": {
        "nouns": {s: ("n", s) for s in SHAPES},
        "colors": {c: c for c in COLORS},
        "sizes": {s: s for s in SIZES},
        "article": "a",  # never "an": the size adjective always follows it
        "np": "{art} {size} {color} {noun}",
        "relations": {"left_of": ("to the left of", "nom"), "right_of": ("to the right of", "nom"),
                      "above": ("above", "nom"), "below": ("below", "nom")},
        "main": "{a} is {rel} {b}",
        "relative": "{pron} is {rel} {b}",
        "pronoun": "which",
        "single": "{a} {where}",
        "locations": {
            "top_left": "in the top left corner", "top": "at the top centre",
            "top_right": "in the top right corner",
            "left": "on the left", "middle": "in the middle", "right": "on the right",
            "bottom_left": "in the bottom left corner", "bottom": "at the bottom centre",
            "bottom_right": "in the bottom right corner",
        },
        # NLI hypotheses: definite noun phrases ("the red circle": unique in a scene)
        "definite": {"article": "the", "np": "{art} {color} {noun}", "size": "{a} is {size}"},
    },
    "de": {
        "nouns": {"circle": ("m", "Kreis"), "square": ("n", "Quadrat"),
                  "triangle": ("n", "Dreieck"), "diamond": ("f", "Raute"),
                  "star": ("m", "Stern")},
        "colors": {c: _de_adj(stem) for c, stem in _DE_COLORS.items()},
        "sizes": {"small": _de_adj("klein"), "large": _de_adj("groß")},
        "article": {"m.nom": "ein", "f.nom": "eine", "n.nom": "ein",
                    "m.dat": "einem", "f.dat": "einer", "n.dat": "einem"},
        "np": "{art} {size} {color} {noun}",
        "relations": {"left_of": ("links von", "dat"), "right_of": ("rechts von", "dat"),
                      "above": ("über", "dat"), "below": ("unter", "dat")},
        "main": "{a} ist {rel} {b}",
        "relative": "{pron} {rel} {b} ist",  # verb-final subordinate clause
        "pronoun": {"m": "der", "f": "die", "n": "das"},
        "single": "{a} {where}",
        "locations": {
            "top_left": "in der oberen linken Ecke", "top": "oben in der Mitte",
            "top_right": "in der oberen rechten Ecke",
            "left": "auf der linken Seite", "middle": "in der Mitte",
            "right": "auf der rechten Seite",
            "bottom_left": "in der unteren linken Ecke", "bottom": "unten in der Mitte",
            "bottom_right": "in der unteren rechten Ecke",
        },
        "definite": {"article": {"m.nom": "der", "f.nom": "die", "n.nom": "das",
                                 "m.dat": "dem", "f.dat": "der", "n.dat": "dem"},
                     "colors": {c: _de_weak(stem) for c, stem in _DE_COLORS.items()},
                     "np": "{art} {color} {noun}",
                     "sizes": {"small": "klein", "large": "groß"},  # predicative: uninflected
                     "size": "{a} ist {size}",
                     "contract": ((r"\bvon dem\b", "vom"),)},
    },
    "fr": {
        "nouns": {"circle": ("m", "cercle"), "square": ("m", "carré"),
                  "triangle": ("m", "triangle"), "diamond": ("m", "losange"),
                  "star": ("f", "étoile")},
        "colors": {"red": "rouge", "green": {"m": "vert", "f": "verte"},
                   "blue": {"m": "bleu", "f": "bleue"}, "yellow": "jaune",
                   "purple": {"m": "violet", "f": "violette"}, "orange": "orange"},
        "sizes": {"small": {"m": "petit", "f": "petite"}, "large": {"m": "grand", "f": "grande"}},
        # "de" is a pseudo-case: "à gauche de" + "un" elides to "à gauche d'un"
        "article": {"m.nom": "un", "f.nom": "une", "m.de": "d'un", "f.de": "d'une"},
        "np": "{art} {size} {noun} {color}",
        "relations": {"left_of": ("à gauche", "de"), "right_of": ("à droite", "de"),
                      "above": ("au-dessus", "de"), "below": ("en dessous", "de")},
        "main": "{a} est {rel} {b}",
        "relative": "{pron} est {rel} {b}",
        "pronoun": "qui",
        "single": "{a} {where}",
        "locations": {
            "top_left": "dans le coin supérieur gauche", "top": "en haut au centre",
            "top_right": "dans le coin supérieur droit",
            "left": "sur la gauche", "middle": "au centre", "right": "sur la droite",
            "bottom_left": "dans le coin inférieur gauche", "bottom": "en bas au centre",
            "bottom_right": "dans le coin inférieur droit",
        },
        "definite": {"article": {"m.nom": "le", "f.nom": "la", "m.de": "du", "f.de": "de la"},
                     "np": "{art} {noun} {color}", "size": "{a} est {size}",
                     "contract": ((r"\b([Ll])[ea] (?=[aeiouéèêâîôû])", r"\1'"),)},  # l'étoile
    },
    "ru": {
        "nouns": {"circle": ("m", _ru_noun("круг", "круга", "кругом")),
                  "square": ("m", _ru_noun("квадрат", "квадрата", "квадратом")),
                  "triangle": ("m", _ru_noun("треугольник", "треугольника", "треугольником")),
                  "diamond": ("m", _ru_noun("ромб", "ромба", "ромбом")),
                  "star": ("f", _ru_noun("звезда", "звезды", "звездой"))},
        "colors": {"red": _ru_adj("красн", "hard"), "green": _ru_adj("зелён", "hard"),
                   "blue": _ru_adj("син", "soft"), "yellow": _ru_adj("жёлт", "hard"),
                   "purple": _ru_adj("фиолетов", "hard"), "orange": _ru_adj("оранжев", "hard")},
        "sizes": {"small": _ru_adj("маленьк", "velar"), "large": _ru_adj("больш", "stressed")},
        "article": "",
        "np": "{art} {size} {color} {noun}",
        "relations": {"left_of": ("слева от", "gen"), "right_of": ("справа от", "gen"),
                      "above": ("над", "ins"), "below": ("под", "ins")},
        "main": "{a} находится {rel} {b}",
        "relative": "{pron} находится {rel} {b}",
        "pronoun": {"m": "который", "f": "которая"},
        "single": "{a} {where}",
        "locations": {
            "top_left": "в левом верхнем углу", "top": "вверху по центру",
            "top_right": "в правом верхнем углу",
            "left": "слева", "middle": "в центре", "right": "справа",
            "bottom_left": "в левом нижнем углу", "bottom": "внизу по центру",
            "bottom_right": "в правом нижнем углу",
        },
        "definite": {"article": "", "np": "{art} {color} {noun}", "size": "{a} {size}"},
    },
    "es": {
        "nouns": {"circle": ("m", "círculo"), "square": ("m", "cuadrado"),
                  "triangle": ("m", "triángulo"), "diamond": ("m", "rombo"),
                  "star": ("f", "estrella")},
        "colors": {"red": {"m": "rojo", "f": "roja"}, "green": "verde", "blue": "azul",
                   "yellow": {"m": "amarillo", "f": "amarilla"},
                   "purple": {"m": "morado", "f": "morada"}, "orange": "naranja"},
        "sizes": {"small": {"m": "pequeño", "f": "pequeña"}, "large": "grande"},
        "article": {"m": "un", "f": "una"},
        "np": "{art} {noun} {color} {size}",
        "relations": {"left_of": ("a la izquierda de", "nom"),
                      "right_of": ("a la derecha de", "nom"),
                      "above": ("encima de", "nom"), "below": ("debajo de", "nom")},
        "main": "{a} está {rel} {b}",
        "relative": "{pron} está {rel} {b}",
        "pronoun": "que",
        "single": "{a} {where}",
        "locations": {
            "top_left": "en la esquina superior izquierda", "top": "arriba en el centro",
            "top_right": "en la esquina superior derecha",
            "left": "a la izquierda", "middle": "en el centro", "right": "a la derecha",
            "bottom_left": "en la esquina inferior izquierda", "bottom": "abajo en el centro",
            "bottom_right": "en la esquina inferior derecha",
        },
        "definite": {"article": {"m": "el", "f": "la"}, "np": "{art} {noun} {color}",
                     "size": "{a} es {size}", "contract": ((r"\bde el\b", "del"),)},
    },
}
# fmt: on
LANGUAGES = tuple(LEXICON)


def _inflect(entry: str | dict[str, str], gender: str, case: str) -> str:
    if isinstance(entry, str):
        return entry
    for k in (f"{gender}.{case}", case, gender):
        if k in entry:
            return entry[k]
    raise KeyError(f"no form for gender {gender!r}, case {case!r} in {entry!r}")


def lexicon_forms(lang: str, table: str) -> set[str]:
    """All lower-cased surface forms of one lexicon table ("colors", "sizes" or "nouns")."""
    forms: set[str] = set()
    for entry in LEXICON[lang][table].values():
        entry = entry[1] if table == "nouns" else entry
        forms.update([entry] if isinstance(entry, str) else entry.values())
    return {f.lower() for f in forms}


# ---------------------------------------------------------------------------------------------
# Scenes


@dataclass(frozen=True)
class Obj:
    """One shape; centre (x, y) and circumradius r are fractions of the image side."""

    shape: str
    color: str
    size: str
    x: float
    y: float
    r: float


@dataclass(frozen=True)
class Scene:
    """A sampled layout; objects are sorted left to right (by x, then y), as captions use."""

    key: str
    split: str
    index: int
    seed: int
    objects: tuple[Obj, ...]

    @property
    def entropy(self) -> list[int]:
        """The words seeding this scene's random streams."""
        return [self.seed, SPLITS[self.split], self.index]


def relation(a: Obj, b: Obj) -> str:
    """Where ``a`` is relative to ``b``, along the axis of their larger centre offset."""
    dx, dy = b.x - a.x, b.y - a.y
    if abs(dx) >= abs(dy):
        return "left_of" if dx > 0 else "right_of"
    return "above" if dy > 0 else "below"  # image y grows downwards


def relations(scene: Scene) -> list[tuple[int, str, int]]:
    """The (subject, relation, object) triples a caption states: consecutive objects."""
    objs = scene.objects
    return [(i, relation(objs[i], objs[i + 1]), i + 1) for i in range(len(objs) - 1)]


def location(obj: Obj) -> str:
    """The 3x3 grid cell holding the object's centre."""
    col, row = min(int(obj.x * 3), 2), min(int(obj.y * 3), 2)
    return LOCATIONS[3 * row + col]


def object_box(obj: Obj) -> list[float]:
    """Normalised [x1, y1, x2, y2] tightly around the drawn shape."""
    hx, hy = _HALF_EXTENT[obj.shape]
    box = (obj.x - hx * obj.r, obj.y - hy * obj.r, obj.x + hx * obj.r, obj.y + hy * obj.r)
    return [round(min(max(v, 0.0), 1.0), 4) for v in box]


def _layout_ok(xy: np.ndarray, r: np.ndarray) -> bool:
    pairs = ~np.eye(len(r), dtype=bool)
    dist = np.linalg.norm(xy[:, None] - xy[None], axis=-1)
    if (dist[pairs] < (r[:, None] + r[None] + GAP)[pairs]).any():
        return False
    if len(r) == 1:  # a lone object is described by grid cell: keep it clear of the cell borders
        off = np.abs(xy[0][:, None] - np.array([1 / 3, 2 / 3]))
        return bool(off.min() >= GRID_MARGIN)
    d = np.abs(np.diff(xy[np.argsort(xy[:, 0], kind="stable")], axis=0))
    big, small = d.max(1), d.min(1)
    return bool((big >= DOMINANCE * small).all())


def sample_scene(seed: int, split: str, index: int) -> Scene:
    """Sample the layout of scene ``index`` of ``split``; depends on nothing else."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choices: {', '.join(SPLITS)}")
    rng = np.random.default_rng([seed, SPLITS[split], index])
    n = int(rng.choice(len(N_OBJECTS_P), p=N_OBJECTS_P)) + 1
    colors, sizes = list(COLORS), list(SIZES)
    # distinct (shape, colour) pairs: "the red circle" always names one object
    combos = rng.choice(len(SHAPES) * len(colors), size=n, replace=False)
    size_ids = rng.integers(0, len(sizes), size=n)
    r = np.array([SIZES[sizes[s]] for s in size_ids])
    lo = (EDGE + r)[:, None]
    for _ in range(_MAX_TRIES):
        xy = rng.uniform(lo, 1 - lo, size=(n, 2))
        if _layout_ok(xy, r):
            break
    else:  # pragma: no cover - the constraints leave plenty of room
        raise RuntimeError(f"could not place scene {split}/{index} (seed {seed})")
    objs = [
        Obj(
            shape=SHAPES[int(c) // len(colors)],
            color=colors[int(c) % len(colors)],
            size=sizes[int(s)],
            x=float(x),
            y=float(y),
            r=float(rad),
        )
        for c, s, (x, y), rad in zip(combos, size_ids, xy, r)
    ]
    objs.sort(key=lambda o: (o.x, o.y))
    return Scene(f"{split}{index:06d}", split, index, seed, tuple(objs))


# ---------------------------------------------------------------------------------------------
# Pixels


def render(scene: Scene, image_size: int) -> Image.Image:
    """Draw the scene as an RGB image of ``image_size`` x ``image_size`` pixels."""
    big = image_size * SUPERSAMPLE
    img = Image.new("RGB", (big, big), BACKGROUND)
    draw = ImageDraw.Draw(img)
    for o in scene.objects:
        cx, cy, r = o.x * big, o.y * big, o.r * big
        fill = COLORS[o.color]
        poly = _POLYGONS[o.shape]
        if poly is None:
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        else:
            draw.polygon([(cx + r * u, cy + r * v) for u, v in poly], fill=fill)
    img = img.resize((image_size, image_size), Image.Resampling.BOX)
    rng = np.random.default_rng([*scene.entropy, _RENDER_STREAM])
    noise = rng.integers(-NOISE, NOISE + 1, size=(image_size, image_size, 1))
    pixels = np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def encode_jpeg(img: Image.Image) -> bytes:
    """JPEG bytes at a fixed quality; 4:4:4 keeps small shapes' colours clean."""
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=JPEG_QUALITY, subsampling=0)
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# Words


def _noun_phrase(lex: dict[str, Any], obj: Obj, case: str) -> str:
    gender, noun = lex["nouns"][obj.shape]
    text = lex["np"].format(
        art=_inflect(lex["article"], gender, case),
        size=_inflect(lex["sizes"][obj.size], gender, case),
        color=_inflect(lex["colors"][obj.color], gender, case),
        noun=_inflect(noun, gender, case),
    )
    return " ".join(text.split())  # articleless languages leave a double space


def describe(scene: Scene, lang: str) -> str:
    """The caption of a scene in one language: every object's attributes and relations."""
    if lang not in LEXICON:
        raise ValueError(f"unknown language {lang!r}; choices: {', '.join(LANGUAGES)}")
    lex = LEXICON[lang]
    objs = scene.objects
    first = _noun_phrase(lex, objs[0], "nom")
    if len(objs) == 1:
        text = lex["single"].format(a=first, where=lex["locations"][location(objs[0])])
    else:
        clauses = []
        for i, rel, j in relations(scene):
            phrase, case = lex["relations"][rel]
            b = _noun_phrase(lex, objs[j], case)
            if i == 0:
                clauses.append(lex["main"].format(a=first, rel=phrase, b=b))
            else:  # "..., which is above B": the pronoun agrees with the previous object
                gender = lex["nouns"][objs[i].shape][0]
                pron = _inflect(lex["pronoun"], gender, "nom")
                clauses.append(lex["relative"].format(pron=pron, rel=phrase, b=b))
        text = ", ".join(clauses)
    return text[0].upper() + text[1:] + "."


def captions(scene: Scene, languages: Sequence[str]) -> dict[str, str]:
    """The scene's caption in each requested language."""
    return {lang: describe(scene, lang) for lang in languages}


def scene_record(scene: Scene, image_size: int, languages: Sequence[str]) -> dict[str, Any]:
    """The ``json`` member of an image-text sample."""
    return {
        "key": scene.key,
        "split": scene.split,
        "width": image_size,
        "height": image_size,
        "captions": captions(scene, languages),
        "objects": [
            {
                "shape": o.shape,
                "color": o.color,
                "size": o.size,
                "label": SHAPES.index(o.shape),
                "color_label": list(COLORS).index(o.color),
                "box": object_box(o),
                "location": location(o),
            }
            for o in scene.objects
        ],
        "relations": [{"subject": i, "relation": r, "object": j} for i, r, j in relations(scene)],
    }


# ---------------------------------------------------------------------------------------------
# NLI: a premise describes the first k objects (left to right); a hypothesis is one claim.

NLI_LABELS = ("entailment", "neutral", "contradiction")
OPPOSITE = {"left_of": "right_of", "right_of": "left_of", "above": "below", "below": "above"}
_NLI_STREAM = 2  # extra entropy word: NLI choices never shift the layout or render streams


@dataclass(frozen=True)
class Claim:
    """A hypothesis's content: ``subject`` has ``size``, or stands in ``relation`` to ``object``.

    Subjects and objects are indices into ``scene.objects``.
    """

    subject: int
    size: str | None = None
    relation: str | None = None
    object: int | None = None


@dataclass(frozen=True)
class NliPair:
    """One language-independent NLI pair: the premise mentions ``scene.objects[:k]``."""

    pair_id: str
    k: int
    claim: Claim
    label: str


def _claim(rng: np.random.Generator, objs: Sequence[Obj], k: int, label: str) -> Claim:
    if label == "neutral":  # about an object the premise does not mention
        j = int(rng.integers(k, len(objs)))
        if rng.random() < 0.5:
            return Claim(j, size=str(rng.choice(list(SIZES))))
        m = int(rng.integers(0, k))
        a, b = (j, m) if rng.random() < 0.5 else (m, j)
        rel = relation(objs[a], objs[b])  # true or false in the scene: the premise can't tell
        return Claim(a, relation=OPPOSITE[rel] if rng.random() < 0.5 else rel, object=b)
    true = label == "entailment"
    stated = [(i, relation(objs[i], objs[i + 1]), i + 1) for i in range(k - 1)]
    if not stated or rng.random() < 0.5:
        i = int(rng.integers(0, k))
        size = objs[i].size if true else next(s for s in SIZES if s != objs[i].size)
        return Claim(i, size=size)
    i, rel, j = stated[int(rng.integers(len(stated)))]
    if rng.random() < 0.5:  # the converse states the same fact: "B is right of A"
        i, rel, j = j, OPPOSITE[rel], i
    # only the opposite contradicts: "A left of B" and "A above B" can both hold on a diagonal
    return Claim(i, relation=rel if true else OPPOSITE[rel], object=j)


def nli_pairs(scene: Scene) -> list[NliPair]:
    """The scene's NLI pairs: 1-3 distinct labels; entailment or contradiction for a lone object.

    A premise of the first k < n objects always leaves one for a neutral hypothesis. Label
    order is shuffled so that a pair id says nothing about its label.
    """
    rng = np.random.default_rng([*scene.entropy, _NLI_STREAM])
    n = len(scene.objects)
    if n == 1:
        k, labels = 1, [NLI_LABELS[0] if rng.random() < 0.5 else NLI_LABELS[2]]
    else:  # a random 1 to 3 of the labels: each is equally likely
        k, m = int(rng.integers(1, n)), int(rng.integers(1, 4))
        labels = [NLI_LABELS[i] for i in rng.permutation(3)[:m]]
    return [
        NliPair(f"{scene.key}_{i}", k, _claim(rng, scene.objects, k, label), label)
        for i, label in enumerate(labels)
    ]


def _definite(lex: dict[str, Any], obj: Obj, case: str) -> str:
    d = lex["definite"]
    gender, noun = lex["nouns"][obj.shape]
    text = d["np"].format(
        art=_inflect(d["article"], gender, case),
        color=_inflect(d.get("colors", lex["colors"])[obj.color], gender, case),
        noun=_inflect(noun, gender, case),
    )
    return " ".join(text.split())


def state(scene: Scene, claim: Claim, lang: str) -> str:
    """The claim as a sentence in one language: "The red circle is large."."""
    lex = LEXICON[lang]
    objs = scene.objects
    a = _definite(lex, objs[claim.subject], "nom")
    if claim.size is not None:
        gender = lex["nouns"][objs[claim.subject].shape][0]
        size = _inflect(lex["definite"].get("sizes", lex["sizes"])[claim.size], gender, "nom")
        text = lex["definite"]["size"].format(a=a, size=size)
    else:
        assert claim.relation is not None and claim.object is not None
        phrase, case = lex["relations"][claim.relation]
        b = _definite(lex, objs[claim.object], case)
        text = lex["main"].format(a=a, rel=phrase, b=b)
    for pattern, repl in lex["definite"].get("contract", ()):
        text = re.sub(pattern, repl, text)
    return text[0].upper() + text[1:] + "."


def nli_text(scene: Scene, pair: NliPair, lang: str) -> tuple[str, str]:
    """(premise, hypothesis) of a pair in one language."""
    premise = describe(dataclasses.replace(scene, objects=scene.objects[: pair.k]), lang)
    return premise, state(scene, pair.claim, lang)


# ---------------------------------------------------------------------------------------------
# Views: each turns the scenes of one split into samples, through a ViewOutput.


@dataclass(frozen=True)
class ViewSettings:
    """What every view needs besides the scenes."""

    languages: tuple[str, ...]
    image_size: int


class ViewOutput:
    """Where one view writes one split: shard sets under ``root``, plain or one per language."""

    def __init__(self, root: Path, split: str, shard_size: int) -> None:
        self.root, self.split, self.shard_size = root, split, shard_size
        self.shards: dict[str | None, list[str]] = {}
        self.samples: dict[str | None, int] = {}

    @contextmanager
    def writer(self, language: str | None = None) -> Iterator[ShardWriter]:
        """A writer of ``{split}-%06d.tar``, or ``{split}-{language}-%06d.tar``."""
        name = self.split if language is None else f"{self.split}-{language}"
        with ShardWriter(self.root / f"{name}-%06d.tar", self.shard_size) as writer:
            yield writer
        self.add(language, writer.shards, writer.count)

    def add(self, language: str | None, shards: Sequence[str], count: int) -> None:
        """Record a shard set written by someone else (a converter)."""
        self.shards[language] = [os.fspath(p) for p in shards]
        self.samples[language] = count


def write_image_text(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """img2dataset-style samples: ``jpg``, ``txt`` (primary caption), ``json`` (annotations)."""
    primary = "en" if "en" in cfg.languages else cfg.languages[0]
    with out.writer() as writer:
        for scene in scenes:
            record = scene_record(scene, cfg.image_size, cfg.languages)
            jpg = encode_jpeg(render(scene, cfg.image_size))
            txt = record["captions"][primary]
            writer.write({"__key__": scene.key, "jpg": jpg, "txt": txt, "json": record})


def write_parallel(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """One sample per scene and unordered language pair: the scene's two captions."""
    pairs = list(itertools.combinations(cfg.languages, 2))
    with out.writer() as writer:
        for scene in scenes:
            caps = captions(scene, cfg.languages)
            for a, b in pairs:
                writer.write(
                    {
                        "__key__": f"{scene.key}_{a}_{b}",
                        "json": {
                            "scene": scene.key,
                            "languages": [a, b],
                            "texts": [caps[a], caps[b]],
                        },
                    }
                )


def write_mono(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """Monolingual text, one shard set per language (so sources can be sampled by size)."""
    for lang in cfg.languages:
        with out.writer(lang) as writer:
            for scene in scenes:
                meta = {"language": lang}
                writer.write(
                    {"__key__": f"{scene.key}_{lang}", "txt": describe(scene, lang), "json": meta}
                )


_MNLI_COLUMNS = XNLI_COLUMNS[1:]


def _tsv_text(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "".join("\t".join(r) + "\n" for r in [header, *rows])


def write_nli(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """NLI pairs in every language, as the corpora ship them, then shards via ``convert_xnli``.

    Writes ``xnli.{split}.tsv`` (XNLI 1.0 layout, all languages); for train also
    ``multinli_1.0_train.txt`` (MultiNLI layout, English) and ``multinli.train.{lang}.tsv``
    (XNLI-MT translate-train layout). Shards: ``{split}-{lang}-%06d.tar``.
    """
    pairs = [(scene, pair) for scene in scenes for pair in nli_pairs(scene)]
    texts = {lang: [nli_text(scene, pair, lang) for scene, pair in pairs] for lang in cfg.languages}
    xnli = [
        [lang, p.label, "", "", "", "", premise, hypo, s.key, p.pair_id, "toyworld", *[p.label] * 5]
        for lang in cfg.languages
        for (s, p), (premise, hypo) in zip(pairs, texts[lang])
    ]
    tsv = out.root / f"xnli.{out.split}.tsv"
    _write_atomic(tsv, _tsv_text(XNLI_COLUMNS, xnli))
    if out.split == "train":
        mnli = [row[1:] for row in xnli if row[0] == "en"]
        path = out.root / "multinli_1.0_train.txt"
        if "en" in cfg.languages:
            _write_atomic(path, _tsv_text(_MNLI_COLUMNS, mnli))
        elif path.exists():
            path.unlink()
        for old in out.root.glob("multinli.train.*.tsv"):
            if old.name.split(".")[2] not in cfg.languages:
                old.unlink()
        for lang in cfg.languages:
            rows = [
                [premise, hypo, "contradictory" if p.label == "contradiction" else p.label]
                for (_, p), (premise, hypo) in zip(pairs, texts[lang])
            ]
            path = out.root / f"multinli.train.{lang}.tsv"
            _write_atomic(path, _tsv_text(("premise", "hypo", "label"), rows))
    stats = convert_xnli(tsv, out.root, split=out.split, shard_size=out.shard_size)
    for lang in cfg.languages:
        got = stats["languages"].get(lang, {"shards": [], "written": 0})
        out.add(lang, got["shards"], got["written"])


VIEWS: dict[str, Callable[[Sequence[Scene], ViewOutput, ViewSettings], None]] = {
    "image_text": write_image_text,
    "parallel": write_parallel,
    "mono": write_mono,
    "nli": write_nli,
}


# ---------------------------------------------------------------------------------------------
# The data set


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _check_args(
    counts: dict[str, int], languages: Sequence[str], image_size: int, shard_size: int
) -> None:
    for split, n in counts.items():
        if n < 0:
            raise ValueError(f"n_{split} must be >= 0, got {n}")
    if not languages:
        raise ValueError("at least one language is needed")
    unknown = [lang for lang in languages if lang not in LEXICON]
    if unknown:
        raise ValueError(f"unknown language(s) {unknown}; choices: {', '.join(LANGUAGES)}")
    if len(set(languages)) != len(languages):
        raise ValueError(f"languages repeat: {list(languages)}")
    if image_size < 16:
        raise ValueError(f"image_size must be >= 16, got {image_size}")
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")


def generate(
    out_dir: str | os.PathLike[str],
    *,
    n_train: int = 4000,
    n_val: int = 500,
    n_test: int = 500,
    seed: int = 0,
    languages: Sequence[str] = ("en", "de", "fr", "ru"),
    image_size: int = 64,
    shard_size: int = 1000,
) -> dict[str, Any]:
    """Write the toyworld data set under ``out_dir`` and return its manifest.

    Layout: ``{view}/{split}-{shard:06d}.tar`` for ``image_text`` and ``parallel``,
    ``{view}/{split}-{lang}-{shard:06d}.tar`` for ``mono`` and ``nli`` (listed per language
    under the manifest's ``by_language``), the NLI TSVs ``nli/xnli.{split}.tsv``,
    ``nli/multinli_1.0_train.txt`` and ``nli/multinli.train.{lang}.tsv``, ``text/{lang}.txt``
    (train captions, one per line) and ``manifest.json`` (written last, so its presence means
    the data set is complete).
    """
    counts = {"train": n_train, "val": n_val, "test": n_test}
    languages = tuple(languages)
    _check_args(counts, languages, image_size, shard_size)
    out = Path(out_dir)
    cfg = ViewSettings(languages=languages, image_size=image_size)
    shards: dict[str, dict[str, list[str]]] = {view: {} for view in VIEWS}
    samples: dict[str, dict[str, int]] = {view: {} for view in VIEWS}
    by_language: dict[str, dict[str, dict[str, Any]]] = {}
    for split, n in counts.items():
        scenes = [sample_scene(seed, split, i) for i in range(n)]
        for view, write in VIEWS.items():
            view_out = ViewOutput(out / view, split, shard_size)
            write(scenes, view_out, cfg)
            written = {Path(p) for paths in view_out.shards.values() for p in paths}
            # a previous, larger run may have left more shards (or other languages); globbing
            # readers would mix them in
            ours = re.compile(rf"{split}(-[A-Za-z0-9_-]+)?-[0-9]{{6}}\.tar")
            for old in (out / view).glob(f"{split}-*.tar"):
                if ours.fullmatch(old.name) and old not in written:
                    old.unlink()

            def rel(paths: list[str]) -> list[str]:
                return [Path(p).relative_to(out).as_posix() for p in paths]

            shards[view][split] = [p for paths in view_out.shards.values() for p in rel(paths)]
            samples[view][split] = sum(view_out.samples.values())
            if None not in view_out.shards:
                by_language.setdefault(view, {})[split] = {
                    lang: {"shards": rel(view_out.shards[lang]), "samples": view_out.samples[lang]}
                    for lang in view_out.shards
                }
        if split == "train":
            for lang in languages:
                lines = "".join(describe(s, lang) + "\n" for s in scenes)
                _write_atomic(out / "text" / f"{lang}.txt", lines)
    manifest = {
        "generator": "toyworld",
        "version": GENERATOR_VERSION,
        "seed": seed,
        "languages": list(languages),
        "image_size": image_size,
        "shard_size": shard_size,
        "counts": counts,
        "samples": samples,
        "shards": shards,
        "by_language": by_language,
        "text": {lang: f"text/{lang}.txt" for lang in languages},
        "nli": {
            "xnli": {split: f"nli/xnli.{split}.tsv" for split in counts},
            "multinli": "nli/multinli_1.0_train.txt" if "en" in languages else None,
            "translate_train": {lang: f"nli/multinli.train.{lang}.tsv" for lang in languages},
        },
        "labels": {
            "shapes": list(SHAPES),
            "colors": list(COLORS),
            "sizes": list(SIZES),
            "relations": list(RELATIONS),
            "locations": list(LOCATIONS),
            "nli": list(NLI_LABELS),
        },
    }
    _write_atomic(out / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest
