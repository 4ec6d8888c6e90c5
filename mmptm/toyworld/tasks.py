"""toyworld's XTREME analogues: tagged mentions and answer spans in every language, written in
the formats the real data sets ship (CoNLL ``word<TAB>tag`` files, SQuAD JSON) and converted
by the same converters (``mmptm data conll``, ``mmptm data squad``).

- **Tagged mentions** (WikiANN's analogue): each scene caption (the sentence toyworld's
  image-text view has, :func:`~mmptm.toyworld.language.describe`) split into words, every
  object's noun phrase tagged as an entity typed by its shape: ``A/B-CIRCLE large/I-CIRCLE
  red/I-CIRCLE circle/I-CIRCLE is/O ...``. A mention is a maximal run of words that are
  article, size, colour or shape forms of the language's lexicon and holds one shape noun;
  the word order, cases and agreement differ by language ("einem kleinen gelben Stern",
  "un cercle vert", "маленьким синим квадратом").
- **Answer spans** (XQuAD's analogue): for each object whose colour no other object of the
  scene has, the question "Which object is red?" in the caption's language, answered by that
  object's mention in the caption.

Files under ``out``: ``tagging/{split}-{lang}.tsv`` and their shards ``tagging/shards/``
(with ``labels.txt``), ``qa/{split}-{lang}.json`` and ``qa/shards/``. The scenes are
toyworld's (``sample_scene(seed, split, i)``): the same captions as its image-text view.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmptm.converters.qa import convert_squad
from mmptm.converters.tagging import convert_tagging
from mmptm.registry import CONVERTERS
from mmptm.toyworld.language import LANGUAGES, LEXICON, describe, lexicon_forms
from mmptm.toyworld.scene import Scene, sample_scene

_WORD = re.compile(r"[\w'’-]+|[^\w\s]")
#: "Which object is {color}?" by language; the colour in its predicative form
QUESTIONS = {
    "en": "Which object is {color}?",
    "de": "Welches Objekt ist {color}?",
    "fr": "Quel objet est {color} ?",
    "ru": "Какой предмет {color}?",
    "es": "¿Qué objeto es {color}?",
}


def _forms(entry: Any) -> list[str]:
    return [entry] if isinstance(entry, str) else list(entry.values())


def _lexicon(lang: str) -> tuple[set[str], dict[str, str]]:
    """The words a mention is made of, and each shape noun form → its shape."""
    lex = LEXICON[lang]
    words = {w.lower() for w in _forms(lex["article"]) if w}
    words |= lexicon_forms(lang, "sizes") | lexicon_forms(lang, "colors")
    nouns = {f.lower(): shape for shape, (_, forms) in lex["nouns"].items() for f in _forms(forms)}
    return words | set(nouns), nouns


def mentions(text: str, lang: str) -> list[tuple[int, int, str]]:
    """Every object mention of a caption: (start, end, shape), in text order."""
    words, nouns = _lexicon(lang)
    out, run = [], []
    for m in [*_WORD.finditer(text), None]:
        if m is not None and m.group().lower() in words:
            run.append(m)
            continue
        shapes = [nouns[w.group().lower()] for w in run if w.group().lower() in nouns]
        if len(shapes) == 1:
            out.append((run[0].start(), run[-1].end(), shapes[0]))
        run = []
    return out


def tagged_words(text: str, lang: str) -> tuple[list[str], list[str]]:
    """The caption's words (punctuation apart) and their BIO tags, typed by shape."""
    spans = mentions(text, lang)
    words, tags = [], []
    for m in _WORD.finditer(text):
        inside = [s for s in spans if s[0] <= m.start() < s[1]]
        tag = "O"
        if inside:
            start, _, shape = inside[0]
            tag = f"{'B' if m.start() == start else 'I'}-{shape.upper()}"
        words.append(m.group())
        tags.append(tag)
    return words, tags


def _predicative(color: str, lang: str) -> str:
    """A colour as "Which object is ...?" says it (agreeing with a masculine "object")."""
    entry = LEXICON[lang]["colors"][color]
    if isinstance(entry, str):
        return entry
    if lang == "de":
        return entry["m.nom"][:-2]  # "roter" → "rot": the predicative form is the stem
    return entry.get("m.nom") or entry["m"]


def questions(scene: Scene, lang: str) -> list[dict[str, Any]]:
    """SQuAD ``qas`` for the scene's caption: one per object of a colour of its own."""
    text = describe(scene, lang)
    found = mentions(text, lang)
    colors = [o.color for o in scene.objects]
    out = []
    for obj in scene.objects:
        if colors.count(obj.color) != 1:
            continue
        forms = {f.lower() for f in _forms(LEXICON[lang]["colors"][obj.color])}
        span = next(
            (a, b) for a, b, shape in found
            if shape == obj.shape and any(w.lower() in forms for w in _WORD.findall(text[a:b]))
        )  # fmt: skip
        q = QUESTIONS[lang].format(color=_predicative(obj.color, lang))
        answer = {"text": text[span[0] : span[1]], "answer_start": span[0]}
        out.append({"id": f"{scene.key}_{obj.color}", "question": q, "answers": [answer]})
    return out


def write_tasks(
    out: str | Path,
    *,
    n_train: int = 2000,
    n_test: int = 300,
    seed: int = 0,
    languages: Sequence[str] = LANGUAGES,
    shard_size: int = 1000,
) -> dict[str, Any]:
    """Write the tagging and QA files and shards under ``out`` (module docstring)."""
    unknown = sorted(set(languages) - set(LANGUAGES))
    if unknown:
        raise ValueError(f"unknown toyworld languages {unknown}; choices: {', '.join(LANGUAGES)}")
    root = Path(out)
    for sub in ("tagging/shards", "qa/shards"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    stats: dict[str, Any] = {}
    for split, n in (("train", n_train), ("test", n_test)):  # train first: labels.txt
        scenes = [sample_scene(seed, split, i) for i in range(n)]
        for lang in languages:
            tsv = root / "tagging" / f"{split}-{lang}.tsv"
            rows = [tagged_words(describe(s, lang), lang) for s in scenes]
            tsv.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(*r)) + "\n" for r in rows),
                           encoding="utf-8")  # fmt: skip
            squad = root / "qa" / f"{split}-{lang}.json"
            paras = [{"context": describe(s, lang), "qas": questions(s, lang)} for s in scenes]
            doc = {"version": "toyworld", "data": [{"title": "toyworld", "paragraphs": paras}]}
            squad.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
            common = {"language": lang, "split": split, "shard_size": shard_size}
            t = convert_tagging("conll", tsv, root / "tagging" / "shards", **common)
            q = convert_squad(squad, root / "qa" / "shards", **common)
            stats[f"{split}-{lang}"] = {"sentences": t["written"], "questions": q["written"]}
    return stats


# --------------------------------------------------------------------------------------------
# mmptm data toyworld-tasks


CONVERTERS.register_writer(
    "toyworld-tasks", "toyworld's tagged mentions and answer spans (WikiANN / XQuAD analogues)",
    write_tasks, ("n_train", "n_test", "seed", "languages", "shard_size"),
    "data/toyworld/tasks",
)  # fmt: skip


__all__ = ["QUESTIONS", "mentions", "questions", "tagged_words", "write_tasks"]
