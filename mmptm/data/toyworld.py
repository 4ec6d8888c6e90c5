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
- ``regions``: the ``image_text`` samples (same keys and members) plus ``regions.npz``, what
  a bottom-up-attention detector would give: one region per object (no whole-image region),
  its box, a frozen random CNN's RoI feature, a noisy class distribution over SHAPES and the
  true shape id (see :func:`detect`).
- ``vqa``: 2-3 questions per scene with ten annotators' answers, written as VQA v2 ships
  (``v2_OpenEnded_toyworld_{split}_questions.json`` + ``v2_toyworld_{split}_annotations.json``)
  and as ``vqa/{split}-%06d.tar`` samples (``jpg``, ``regions.npz``, ``json``): what
  :func:`mmptm.data.converters_vl.convert_vqa` makes of those files, the images and the
  regions as a BUTD TSV (tested; the TSV drops only ``probs``). Written directly, which
  spares putting every image on disk just to read it back.

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
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from mmptm.data.converters import XNLI_COLUMNS, convert_xnli
from mmptm.data.converters_vl import regions_npz_bytes
from mmptm.data.shards import ShardWriter

__all__ = [
    "ANSWER_TYPES",
    "COLORS",
    "DETECTOR_FEATURES",
    "DETECTOR_SEED",
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
    "VqaQuestion",
    "captions",
    "describe",
    "detect",
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
    "roi_features",
    "sample_scene",
    "scene_record",
    "state",
    "vqa_file_names",
    "vqa_questions",
]

# Bump whenever the same arguments would produce different bytes.
# 2: views mono and nli (image_text, parallel and text/ unchanged since 1).
# 3: views regions and vqa (the others unchanged since 2).
GENERATOR_VERSION = 3

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


@lru_cache(maxsize=1)
def _jpegs(scenes: tuple[Scene, ...], image_size: int) -> tuple[bytes, ...]:
    """The scenes' JPEGs; cached because the image_text, regions and vqa views all need them."""
    return tuple(encode_jpeg(render(s, image_size)) for s in scenes)


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
# Detector: what a bottom-up-attention model would report for each object.

DETECTOR_SEED = 0  # one fixed "detector" for every data seed, as in practice
DETECTOR_FEATURES = 64
_ROI_SIZE = 16  # each box is cropped and resized to this many pixels a side
_FEATURE_STEP = 2.0**-16  # features are rounded to this grid, see roi_features
_PROB_MARGIN = 3.0  # logit bonus of the true shape
_PROB_NOISE = 1.0  # std of the logit noise: the arg-max is wrong for ~7% of objects
_DETECTOR_STREAM = 3  # extra entropy words, as for NLI: new streams never shift old ones
_VQA_STREAM = 4


@lru_cache(maxsize=1)
def _cnn_weights() -> tuple[np.ndarray, ...]:
    """He-initialised 3x3 kernels of a 3-layer CNN (3 -> 16 -> 32 -> 64), never trained."""
    rng = np.random.default_rng([DETECTOR_SEED, _DETECTOR_STREAM])
    widths = (3, 16, 32, DETECTOR_FEATURES)
    return tuple(
        rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (9 * cin))
        for cin, cout in itertools.pairwise(widths)
    )


def roi_features(images: np.ndarray, boxes: Sequence[np.ndarray]) -> list[np.ndarray]:
    """RoI features [R_i, DETECTOR_FEATURES] of uint8 images [B,H,W,3] and normalised boxes.

    Each box is cropped with ``roi_align`` to 16x16 pixels and passed through a frozen,
    seeded CNN (3x3 conv + ReLU, strides 2, 2, 1) and global average pooling. Computed in
    float64 and rounded to a 2**-16 grid: summation order (batch size, threads, CPU kernels)
    moves float64 results far less than the grid step, so the bytes do not depend on it.
    """
    import torch  # lazily: the text-only views do not need torch
    from torch.nn.functional import conv2d
    from torchvision.ops import roi_align

    counts = [len(b) for b in boxes]
    if not sum(counts):
        return [np.zeros((0, DETECTOR_FEATURES), np.float32) for _ in boxes]
    _, h, w, _ = images.shape
    pixels = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).double()
    pixels = (pixels / 255 - 0.5) / 0.25
    scale = np.array([w, h, w, h], np.float64)
    rois = np.concatenate(
        [np.c_[np.full(len(b), i), np.asarray(b, np.float64) * scale] for i, b in enumerate(boxes)]
    )
    with torch.no_grad():
        x = roi_align(pixels, torch.from_numpy(rois), _ROI_SIZE, 1.0, 2, aligned=True)
        for kernel, stride in zip(_cnn_weights(), (2, 2, 1)):
            x = torch.relu(conv2d(x, torch.from_numpy(kernel), stride=stride, padding=1))
        feats = x.mean((2, 3)).numpy()
    feats = (np.round(feats / _FEATURE_STEP) * _FEATURE_STEP).astype(np.float32)
    return np.split(feats, np.cumsum(counts)[:-1])


def _class_probs(scene: Scene) -> np.ndarray:
    """A noisy detector's distribution over SHAPES per object: softmax(3 one-hot + noise)."""
    rng = np.random.default_rng([*scene.entropy, _DETECTOR_STREAM])
    labels = [SHAPES.index(o.shape) for o in scene.objects]
    logits = _PROB_MARGIN * np.eye(len(SHAPES))[labels]
    logits = logits + _PROB_NOISE * rng.standard_normal(logits.shape)
    e = np.exp(logits - logits.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)).astype(np.float32)


def detect(scenes: Sequence[Scene], image_size: int) -> list[dict[str, Any]]:
    """What a detector reports per scene, as ``regions.npz`` records (plus the ``jpg``).

    One region per object, in the scene's (left to right) order: ``boxes`` = the objects'
    normalised boxes, ``features`` = :func:`roi_features` of the JPEG the samples carry,
    ``probs`` over SHAPES (the true shape gets most mass, not always the most), ``labels`` =
    the true shape ids, ``image_size`` = (w, h). Colour is not a detector class: it is left
    for the features to carry.
    """
    jpgs = _jpegs(tuple(scenes), image_size)
    boxes = [np.array([object_box(o) for o in s.objects], np.float32) for s in scenes]
    records = []
    chunk = 500  # bounds memory; roi_features' results do not depend on the chunking
    for start in range(0, len(scenes), chunk):
        part = slice(start, start + chunk)
        images = np.stack(
            [np.asarray(Image.open(io.BytesIO(j)).convert("RGB")) for j in jpgs[part]]
        )
        for scene, jpg, box, feats in zip(
            scenes[part], jpgs[part], boxes[part], roi_features(images, boxes[part])
        ):
            records.append(
                {
                    "jpg": jpg,
                    "features": feats,
                    "boxes": box,
                    "image_size": np.array([image_size, image_size], np.int32),
                    "probs": _class_probs(scene),
                    "labels": np.array([SHAPES.index(o.shape) for o in scene.objects], np.int64),
                }
            )
    return records


@lru_cache(maxsize=1)
def _detections(scenes: tuple[Scene, ...], image_size: int) -> tuple[tuple[bytes, bytes], ...]:
    """(jpg, regions.npz) per scene; cached because the regions and vqa views both need them."""
    return tuple((r["jpg"], regions_npz_bytes(r)) for r in detect(scenes, image_size))


# ---------------------------------------------------------------------------------------------
# VQA: questions about a scene, each answered by ten noisy annotators.

ANSWER_TYPES = ("yes/no", "number", "other")
_N_ANSWERS = 10
_N_WRONG_P = (0.4, 0.3, 0.2, 0.1)  # P(0..3 of the ten annotators say something else)
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five")
# plausible mistakes, and other words for the same thing
_COLOR_CONFUSION = {
    "red": ("orange", "purple"),
    "green": ("yellow", "blue"),
    "blue": ("purple", "green"),
    "yellow": ("orange", "green"),
    "purple": ("blue", "red"),
    "orange": ("red", "yellow"),
}
_SHAPE_CONFUSION = {
    "circle": ("star", "square"),
    "square": ("diamond", "circle"),
    "triangle": ("star", "diamond"),
    "diamond": ("square", "triangle"),
    "star": ("triangle", "circle"),
}
_SYNONYMS = {"purple": ("violet",), "diamond": ("rhombus",), "circle": ("round",)}


@dataclass(frozen=True)
class VqaQuestion:
    """One question about a scene: the truth and the ten annotators' raw answers."""

    question_id: int
    question: str
    answer: str
    answer_type: str
    question_type: str
    answers: tuple[str, ...]
    confidences: tuple[str, ...]  # VQA's answer_confidence: "yes" or "maybe"


# A question kind returns (question, answer, answer_type, question_type, mistakes, synonyms),
# or None when the scene cannot pose it unambiguously.
_Posed = tuple[str, str, str, str, Sequence[str], Sequence[str]]


def _pick(rng: np.random.Generator, items: Sequence[Any]) -> Any:
    return items[int(rng.integers(len(items)))]


def _ask_color(rng: np.random.Generator, objs: Sequence[Obj]) -> _Posed | None:
    shapes = [o.shape for o in objs]
    unique = [o for o in objs if shapes.count(o.shape) == 1]
    if not unique:
        return None
    o = _pick(rng, unique)
    return (
        f"What color is the {o.shape}?",
        o.color,
        "other",
        "what color is the",
        _COLOR_CONFUSION[o.color],
        _SYNONYMS.get(o.color, ()),
    )


def _ask_shape(rng: np.random.Generator, objs: Sequence[Obj]) -> _Posed | None:
    colors = [o.color for o in objs]
    unique = [o for o in objs if colors.count(o.color) == 1]
    if not unique:
        return None
    o = _pick(rng, unique)
    return (
        f"What shape is the {o.color} object?",
        o.shape,
        "other",
        "what shape is the",
        _SHAPE_CONFUSION[o.shape],
        _SYNONYMS.get(o.shape, ()),
    )


def _ask_count(rng: np.random.Generator, objs: Sequence[Obj]) -> _Posed:
    if rng.random() < 0.5:
        question, n = "How many shapes are there?", len(objs)
    else:  # mostly a shape in the scene; sometimes any, so "0" happens
        shape = _pick(rng, [o.shape for o in objs] if rng.random() < 0.7 else SHAPES)
        question, n = f"How many {shape}s are there?", sum(o.shape == shape for o in objs)
    mistakes = [str(m) for m in (n - 1, n + 1) if m >= 0]
    return question, str(n), "number", "how many", mistakes, (_NUMBER_WORDS[n],)


def _ask_spatial(rng: np.random.Generator, objs: Sequence[Obj]) -> _Posed | None:
    """ "What is to the left of X?": asked only when exactly one object is on that side."""
    sides = {
        "left_of": lambda b, a: b.x < a.x,
        "right_of": lambda b, a: b.x > a.x,
        "above": lambda b, a: b.y < a.y,
        "below": lambda b, a: b.y > a.y,
    }
    for i in rng.permutation(len(objs) * len(RELATIONS)):
        ref, rel = objs[i // len(RELATIONS)], RELATIONS[i % len(RELATIONS)]
        side = [b for b in objs if b is not ref and sides[rel](b, ref)]
        if len(side) == 1 and relation(side[0], ref) == rel:
            phrase = LEXICON["en"]["relations"][rel][0]
            others = [o.shape for o in objs if o is not side[0]]
            mistakes = others + list(_SHAPE_CONFUSION[side[0].shape])
            mistakes = sorted(set(mistakes) - {side[0].shape}, key=mistakes.index)
            return (
                f"What is {phrase} the {ref.color} {ref.shape}?",
                side[0].shape,
                "other",
                "what is",
                mistakes,
                _SYNONYMS.get(side[0].shape, ()),
            )
    return None


def _ask_exists(rng: np.random.Generator, objs: Sequence[Obj]) -> _Posed:
    """ "Is there a green triangle?": yes or no with equal odds; half the noes are near misses."""
    present = {(o.color, o.shape) for o in objs}
    if rng.random() < 0.5:
        color, shape = _pick(rng, sorted(present))
    else:
        absent = [(c, s) for s in SHAPES for c in COLORS if (c, s) not in present]
        near = [(c, s) for c, s in absent if any(c == pc or s == ps for pc, ps in present)]
        color, shape = _pick(rng, near if near and rng.random() < 0.5 else absent)
    answer = "yes" if (color, shape) in present else "no"
    wrong = "no" if answer == "yes" else "yes"
    return f"Is there a {color} {shape}?", answer, "yes/no", "is there a", (wrong,), ()


_QUESTION_KINDS: tuple[Callable[[np.random.Generator, Sequence[Obj]], _Posed | None], ...] = (
    _ask_color,
    _ask_shape,
    _ask_count,
    _ask_spatial,
    _ask_exists,
)


def _annotate(rng: np.random.Generator, posed: _Posed) -> tuple[list[str], list[str]]:
    """Ten answers: the truth, but for 0-3 mistakes or synonyms at random positions."""
    _, answer, _, _, mistakes, synonyms = posed
    answers, confidences = [answer] * _N_ANSWERS, ["yes"] * _N_ANSWERS
    n_wrong = int(rng.choice(len(_N_WRONG_P), p=_N_WRONG_P))
    for pos in rng.permutation(_N_ANSWERS)[:n_wrong]:
        use_synonym = synonyms and rng.random() < 0.5
        answers[pos] = _pick(rng, synonyms if use_synonym else mistakes)
        confidences[pos] = "yes" if use_synonym else "maybe"
    return answers, confidences


def vqa_questions(scene: Scene) -> list[VqaQuestion]:
    """2-3 questions of different kinds; ids are ``scene.index * 10 + k``, the image id the index.

    Kinds: colour, shape, count, spatial and yes/no existence; colour, shape and spatial
    questions are only asked when their referent is unambiguous (count and yes/no always are).
    """
    rng = np.random.default_rng([*scene.entropy, _VQA_STREAM])
    n = int(rng.integers(2, 4))
    posed = []
    for i in rng.permutation(len(_QUESTION_KINDS)):
        got = _QUESTION_KINDS[i](rng, scene.objects)
        if got is not None:
            posed.append(got)
        if len(posed) == n:
            break
    out = []
    for k, p in enumerate(posed):
        answers, confidences = _annotate(rng, p)
        out.append(
            VqaQuestion(
                scene.index * 10 + k, p[0], p[1], p[2], p[3], tuple(answers), tuple(confidences)
            )
        )
    return out


def _vqa_record(scene: Scene, q: VqaQuestion) -> dict[str, Any]:
    """The ``json`` of a VQA sample: what ``convert_vqa`` makes of the VQA v2 files."""
    return {
        "question": q.question,
        "question_id": q.question_id,
        "image_id": scene.index,
        "answers": list(q.answers),
        "answer_type": q.answer_type,
        "question_type": q.question_type,
        "multiple_choice_answer": q.answer,
    }


def _vqa_files(split: str, items: Sequence[tuple[Scene, VqaQuestion]]) -> tuple[dict, dict]:
    """The VQA v2 questions and annotations files' contents."""
    info = {"description": "toyworld VQA", "version": str(GENERATOR_VERSION)}
    head = {"info": info, "data_type": "toyworld", "data_subtype": split, "license": {}}
    questions = {
        **head,
        "task_type": "Open-Ended",
        "questions": [
            {"image_id": s.index, "question": q.question, "question_id": q.question_id}
            for s, q in items
        ],
    }
    annotations = {
        **head,
        "annotations": [
            {
                "question_type": q.question_type,
                "multiple_choice_answer": q.answer,
                "answers": [
                    {"answer": a, "answer_confidence": c, "answer_id": i + 1}
                    for i, (a, c) in enumerate(zip(q.answers, q.confidences))
                ],
                "image_id": s.index,
                "answer_type": q.answer_type,
                "question_id": q.question_id,
            }
            for s, q in items
        ],
    }
    return questions, annotations


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


@lru_cache(maxsize=1)
def _records(
    scenes: tuple[Scene, ...], image_size: int, languages: tuple[str, ...]
) -> tuple[dict[str, Any], ...]:
    """scene_record per scene, shared by image_text and regions; callers must not mutate."""
    return tuple(scene_record(s, image_size, languages) for s in scenes)


def write_image_text(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """img2dataset-style samples: ``jpg``, ``txt`` (primary caption), ``json`` (annotations)."""
    primary = _primary(cfg)
    jpgs = _jpegs(tuple(scenes), cfg.image_size)
    records = _records(tuple(scenes), cfg.image_size, cfg.languages)
    with out.writer() as writer:
        for scene, jpg, record in zip(scenes, jpgs, records):
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


def _primary(cfg: ViewSettings) -> str:
    return "en" if "en" in cfg.languages else cfg.languages[0]


def write_regions(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """The ``image_text`` samples (same keys, same bytes) plus ``regions.npz`` (see detect)."""
    primary = _primary(cfg)
    media = _detections(tuple(scenes), cfg.image_size)
    records = _records(tuple(scenes), cfg.image_size, cfg.languages)
    with out.writer() as writer:
        for scene, (jpg, npz), record in zip(scenes, media, records):
            txt = record["captions"][primary]
            sample = {"__key__": scene.key, "jpg": jpg, "txt": txt, "json": record}
            writer.write({**sample, "regions.npz": npz})


def vqa_file_names(split: str) -> tuple[str, str]:
    """The VQA v2 questions and annotations file names of a split."""
    return (
        f"v2_OpenEnded_toyworld_{split}_questions.json",
        f"v2_toyworld_{split}_annotations.json",
    )


def write_vqa(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """VQA v2 questions/annotations JSON files and ``{split}-%06d.tar`` samples.

    Samples (key = question id) hold ``jpg``, ``regions.npz`` (as in the regions view) and
    the VQA ``json``, the members ``convert_vqa`` gives for the JSON files plus the images
    and region features.
    """
    items = [(scene, q) for scene in scenes for q in vqa_questions(scene)]
    for name, content in zip(vqa_file_names(out.split), _vqa_files(out.split, items)):
        _write_atomic(out.root / name, json.dumps(content, ensure_ascii=False) + "\n")
    media = dict(zip((s.key for s in scenes), _detections(tuple(scenes), cfg.image_size)))
    with out.writer() as writer:
        for scene, q in items:
            jpg, npz = media[scene.key]
            record = _vqa_record(scene, q)
            writer.write(
                {"__key__": str(q.question_id), "jpg": jpg, "regions.npz": npz, "json": record}
            )


VIEWS: dict[str, Callable[[Sequence[Scene], ViewOutput, ViewSettings], None]] = {
    "image_text": write_image_text,
    "parallel": write_parallel,
    "mono": write_mono,
    "nli": write_nli,
    "regions": write_regions,
    "vqa": write_vqa,
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

    Layout: ``{view}/{split}-{shard:06d}.tar`` for ``image_text``, ``parallel``, ``regions``
    and ``vqa``,
    ``{view}/{split}-{lang}-{shard:06d}.tar`` for ``mono`` and ``nli`` (listed per language
    under the manifest's ``by_language``), the NLI TSVs ``nli/xnli.{split}.tsv``,
    ``nli/multinli_1.0_train.txt`` and ``nli/multinli.train.{lang}.tsv``, the VQA v2 files
    ``vqa/v2_OpenEnded_toyworld_{split}_questions.json`` and
    ``vqa/v2_toyworld_{split}_annotations.json``, ``text/{lang}.txt``
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
        "vqa": {
            kind: {split: f"vqa/{vqa_file_names(split)[i]}" for split in counts}
            for i, kind in enumerate(("questions", "annotations"))
        },
        "detector": {
            "classes": list(SHAPES),
            "feature_dim": DETECTOR_FEATURES,
            "roi_size": _ROI_SIZE,
            "seed": DETECTOR_SEED,
        },
        "labels": {
            "shapes": list(SHAPES),
            "colors": list(COLORS),
            "sizes": list(SIZES),
            "relations": list(RELATIONS),
            "locations": list(LOCATIONS),
            "nli": list(NLI_LABELS),
            "answer_types": list(ANSWER_TYPES),
        },
    }
    _write_atomic(out / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest
