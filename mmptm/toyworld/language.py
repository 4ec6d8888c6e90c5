"""Words: the lexicons and grammar of every language, captions and NLI pairs.

:data:`LEXICON` holds each language's forms and templates; :func:`describe` turns a scene
into its caption, :func:`granular_captions` words it more finely: each object
(:func:`object_phrase`), each neighbouring pair (:func:`pair_caption`), every object
without relations (:func:`object_list`). :func:`nli_pairs` draws language-independent NLI
pairs and :func:`nli_text` / :func:`state` put them into words; :func:`statements` states a
scene's :func:`facts` in the same words, for the text corpora.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmptm.toyworld.scene import (
    COLORS,
    SHAPES,
    SIZES,
    Obj,
    Scene,
    location,
    relation,
    relations,
)

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
        "and": "and",  # lists: "a, b and c"
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
        "and": "und",
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
        "named": {"de": "de {name}"},  # names start with a consonant: never "d'"
        "np": "{art} {size} {noun} {color}",
        "relations": {"left_of": ("à gauche", "de"), "right_of": ("à droite", "de"),
                      "above": ("au-dessus", "de"), "below": ("en dessous", "de")},
        "main": "{a} est {rel} {b}",
        "relative": "{pron} est {rel} {b}",
        "pronoun": "qui",
        "and": "et",
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
        "and": "и",
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
        "and": "y",  # never "e": the next word is always "un" or "una"
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
# Words


def _noun_phrase(lex: dict[str, Any], obj: Obj, case: str, name: str | None = None) -> str:
    """The object as an indefinite noun phrase in ``case``, or by its ``name`` if it has one
    (names do not inflect: the knowledge view's toy names are chosen so that they need not)."""
    if name is not None:
        return lex.get("named", {}).get(case, "{name}").format(name=name)
    gender, noun = lex["nouns"][obj.shape]
    text = lex["np"].format(
        art=_inflect(lex["article"], gender, case),
        size=_inflect(lex["sizes"][obj.size], gender, case),
        color=_inflect(lex["colors"][obj.color], gender, case),
        noun=_inflect(noun, gender, case),
    )
    return " ".join(text.split())  # articleless languages leave a double space


def object_phrase(shape: str, color: str, size: str, lang: str) -> str:
    """One object as a short query is typed: an indefinite noun phrase in the nominative, no
    capital, no full stop ("a large red circle", "ein kleiner gelber Stern", "большой синий
    квадрат")."""
    if lang not in LEXICON:
        raise ValueError(f"unknown language {lang!r}; choices: {', '.join(LANGUAGES)}")
    # the noun phrase reads the attributes only; the position does not matter
    return _noun_phrase(LEXICON[lang], Obj(shape, color, size, 0.0, 0.0, 0.0), "nom")


def describe(scene: Scene, lang: str, names: Sequence[str | None] | None = None) -> str:
    """The caption of a scene in one language: every object's attributes and relations.

    ``names``: per object, a proper name to say instead of its noun phrase (None: the noun
    phrase), as the knowledge view's toys are named ("Bimo is to the left of Kesti").
    """
    if lang not in LEXICON:
        raise ValueError(f"unknown language {lang!r}; choices: {', '.join(LANGUAGES)}")
    lex = LEXICON[lang]
    objs = scene.objects
    names = names or [None] * len(objs)
    first = _noun_phrase(lex, objs[0], "nom", names[0])
    if len(objs) == 1:
        text = lex["single"].format(a=first, where=lex["locations"][location(objs[0])])
    else:
        clauses = []
        for i, rel, j in relations(scene):
            phrase, case = lex["relations"][rel]
            b = _noun_phrase(lex, objs[j], case, names[j])
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


#: the image_text json field holding each granularity of caption, finest first: one object
#: ("a large red circle"), two neighbours and their relation, every object without relations
#: ("a large red circle, a small blue star and ..."), the whole scene
CAPTION_FIELDS = {
    "object": "object_captions",
    "pair": "pair_captions",
    "list": "list_captions",
    "scene": "captions",
}


def object_list(scene: Scene, lang: str, first: int = 0) -> str:
    """Every object of the scene as query-like phrases joined as a list ("a large red circle,
    a small blue star and a small purple diamond"), in scene order from object ``first`` on
    and round; one object alone is its :func:`object_phrase`."""
    objs = scene.objects[first:] + scene.objects[:first]
    phrases = [object_phrase(o.shape, o.color, o.size, lang) for o in objs]
    if len(phrases) == 1:
        return phrases[0]
    return f"{', '.join(phrases[:-1])} {LEXICON[lang]['and']} {phrases[-1]}"


def pair_caption(a: Obj, b: Obj, lang: str) -> str:
    """Two objects and where the first is relative to the second, as a sentence: "A large red
    circle is to the left of a small blue star."."""
    lex = LEXICON[lang]
    phrase, case = lex["relations"][relation(a, b)]
    text = lex["main"].format(
        a=_noun_phrase(lex, a, "nom"), rel=phrase, b=_noun_phrase(lex, b, case)
    )
    return text[0].upper() + text[1:] + "."


def granular_captions(scene: Scene, languages: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The scene's finer captions by json field (:data:`CAPTION_FIELDS`), per language.

    ``object_captions``: each object in scene order, as :func:`object_phrase` words it.
    ``pair_captions``: each pair of neighbours a scene caption relates (left to right), said
    from both ends ("A is to the left of B.", "B is to the right of A."); none for a lone
    object. ``list_captions``: every object (:func:`object_list`), once starting from each,
    so that every object leads one of them.
    """
    objs = scene.objects
    pairs = [(objs[i], objs[j]) for i, _, j in relations(scene)]
    return {
        CAPTION_FIELDS["object"]: {
            lang: [object_phrase(o.shape, o.color, o.size, lang) for o in objs]
            for lang in languages
        },
        CAPTION_FIELDS["pair"]: {
            lang: [pair_caption(x, y, lang) for a, b in pairs for x, y in ((a, b), (b, a))]
            for lang in languages
        },
        CAPTION_FIELDS["list"]: {
            lang: [object_list(scene, lang, i) for i in range(len(objs))] for lang in languages
        },
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


def definite(obj: Obj, lang: str) -> str:
    """The object as a definite noun phrase in the nominative ("the red circle", French
    "l'étoile verte"): a scene's (colour, shape) pairs are distinct, so it names one object."""
    lex = LEXICON[lang]
    text = _definite(lex, obj, "nom")
    for pattern, repl in lex["definite"].get("contract", ()):
        text = re.sub(pattern, repl, text)
    return text


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


MAX_STATEMENTS = 4  # four short sentences fit the recipes' 48 tokens in every language
_STATEMENT_STREAM = 5  # extra entropy word, as for NLI, the detector and VQA


def facts(scene: Scene) -> list[Claim]:
    """True claims of the kinds NLI hypotheses make, at most :data:`MAX_STATEMENTS`.

    Drawn from every object's size and each left-to-right neighbour relation (stated from
    either side), kept in that order.
    """
    rng = np.random.default_rng([*scene.entropy, _STATEMENT_STREAM])
    objs = scene.objects
    claims = [Claim(i, size=o.size) for i, o in enumerate(objs)]
    for i in range(len(objs) - 1):
        a, b = (i, i + 1) if rng.random() < 0.5 else (i + 1, i)
        claims.append(Claim(a, relation=relation(objs[a], objs[b]), object=b))
    if len(claims) > MAX_STATEMENTS:
        keep = np.sort(rng.permutation(len(claims))[:MAX_STATEMENTS])
        claims = [claims[int(i)] for i in keep]
    return claims


def statements(scene: Scene, lang: str) -> str:
    """The scene's :func:`facts` as sentences in one language: "The red circle is large. ..."."""
    return " ".join(state(scene, claim, lang) for claim in facts(scene))


def nli_text(scene: Scene, pair: NliPair, lang: str) -> tuple[str, str]:
    """(premise, hypothesis) of a pair in one language."""
    premise = describe(dataclasses.replace(scene, objects=scene.objects[: pair.k]), lang)
    return premise, state(scene, pair.claim, lang)
