"""VQA: questions about a scene, each answered by ten noisy annotators, and the VQA v2 files."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmptm.toyworld.language import LEXICON
from mmptm.toyworld.scene import (
    COLORS,
    GENERATOR_VERSION,
    RELATIONS,
    SHAPES,
    Obj,
    Scene,
    relation,
)

ANSWER_TYPES = ("yes/no", "number", "other")
_N_ANSWERS = 10
_N_WRONG_P = (0.4, 0.3, 0.2, 0.1)  # P(0..3 of the ten annotators say something else)
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five")
_VQA_STREAM = 4  # extra entropy word, as for NLI and the detector
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


def qa_record(q: VqaQuestion, item: tuple[str, Any], **extra: Any) -> dict[str, Any]:
    """A question's ``json`` in the VQA layout; ``item`` is the (key, id) of what it asks
    about (``image_id`` here, ``video_id`` for video QA), ``extra`` fields come last."""
    return {
        "question": q.question,
        "question_id": q.question_id,
        item[0]: item[1],
        "answers": list(q.answers),
        "answer_type": q.answer_type,
        "question_type": q.question_type,
        "multiple_choice_answer": q.answer,
        **extra,
    }


def _vqa_record(scene: Scene, q: VqaQuestion) -> dict[str, Any]:
    """The ``json`` of a VQA sample: what ``convert_vqa`` makes of the VQA v2 files."""
    return qa_record(q, ("image_id", scene.index))


def vqa_file_names(split: str) -> tuple[str, str]:
    """The VQA v2 questions and annotations file names of a split."""
    return (
        f"v2_OpenEnded_toyworld_{split}_questions.json",
        f"v2_toyworld_{split}_annotations.json",
    )


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
