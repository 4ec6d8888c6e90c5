"""Video: clips in which a scene's shapes move, grow or shrink, appear or disappear.

A :class:`Clip` is a scene (its layout at frame 0, from :func:`sample_scene`, so clip ``i``
starts from image ``i``) and one or two :class:`Event` s, each changing one object over its
own frames: with two events, the first runs over frames 0-3 and the second over 4-7 of
:data:`CLIP_FRAMES` = 8; a lone event spans the whole clip. Events never share an object, so
:func:`narrate`'s caption ("The red circle moves left, then the blue square grows.") and its
:func:`reverse_clip` counterpart (the clip played backwards: "The blue square shrinks, then
the red circle moves right.") always differ: a lone event flips its verb, two events swap
their order and the first-named object changes.

Geometry is exact under reversal: positions and radii are interpolated as
``(p0 * (n - k) + p1 * k) / n`` and an object appears or disappears half-way through its
event, so ``render_clip(reverse_clip(clip))`` is ``render_clip(clip)`` played backwards,
pixel for pixel. Moves (a quarter of the image side) and growth stay inside the image and keep
clear of every other object (hidden ones included) along the way.

:func:`video_questions` asks 2-3 English questions per clip (direction, what happens to an
object, which changes first, how many shapes at the start or end) with ten annotators'
answers, as :mod:`~mmptm.toyworld.vqa` does for images.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmptm.toyworld.language import LEXICON, _definite
from mmptm.toyworld.scene import (
    COLORS,
    EDGE,
    GAP,
    SHAPES,
    SIZES,
    Obj,
    Scene,
    object_box,
    render,
    sample_scene,
)
from mmptm.toyworld.vqa import _N_ANSWERS, VqaQuestion, _annotate, _pick, qa_record

CLIP_FRAMES = 8
CLIP_FPS = 8
MOVE = 0.25  # a move's length, as a fraction of the image side
EVENT_KINDS = (
    "move_left",
    "move_right",
    "move_up",
    "move_down",
    "grow",
    "shrink",
    "appear",
    "disappear",
)
REVERSE = {
    "move_left": "move_right",
    "move_right": "move_left",
    "move_up": "move_down",
    "move_down": "move_up",
    "grow": "shrink",
    "shrink": "grow",
    "appear": "disappear",
    "disappear": "appear",
}
_STEP = {"move_left": (-1, 0), "move_right": (1, 0), "move_up": (0, -1), "move_down": (0, 1)}
_TWO_EVENTS_P = 0.7  # P(two events | at least two objects)
_KIND_P = (0.5, 0.25, 0.25)  # P(move), P(grow or shrink), P(appear or disappear)
_MOTION_STREAM = 6  # extra entropy words, as for NLI, the detector, VQA and statements
_VIDEO_QA_STREAM = 7


@dataclass(frozen=True)
class Event:
    """``scene.objects[object]`` does ``kind`` over frames ``start`` to ``end`` (inclusive)."""

    kind: str
    object: int
    start: int
    end: int


@dataclass(frozen=True)
class Clip:
    """A scene at frame 0 (objects in a fixed order, hidden ones too) and its events in order."""

    scene: Scene
    events: tuple[Event, ...]
    frames: int = CLIP_FRAMES

    @property
    def key(self) -> str:
        return self.scene.key


def _end_state(obj: Obj, kind: str) -> Obj:
    if kind in _STEP:
        dx, dy = _STEP[kind]
        return dataclasses.replace(obj, x=obj.x + dx * MOVE, y=obj.y + dy * MOVE)
    if kind in ("grow", "shrink"):
        size = "large" if kind == "grow" else "small"
        return dataclasses.replace(obj, size=size, r=SIZES[size])
    return obj


def _inside(obj: Obj) -> bool:
    lo, hi = EDGE + obj.r, 1 - EDGE - obj.r
    return lo <= obj.x <= hi and lo <= obj.y <= hi


def _clear(a0: Obj, a1: Obj, others: Sequence[Obj]) -> bool:
    """Whether ``a`` going from ``a0`` to ``a1`` (radius at most a1's) keeps GAP to all others."""
    p, q = np.array([a0.x, a0.y]), np.array([a1.x, a1.y])
    seg = q - p
    for o in others:
        c = np.array([o.x, o.y])
        t = 0.0 if not seg.any() else float(np.clip((c - p) @ seg / (seg @ seg), 0, 1))
        if np.linalg.norm(p + t * seg - c) < max(a0.r, a1.r) + o.r + GAP:
            return False
    return True


def _feasible(state: Sequence[Obj], i: int, kind: str) -> bool:
    obj, end = state[i], _end_state(state[i], kind)
    others = [o for j, o in enumerate(state) if j != i]
    return _inside(end) and _clear(obj, end, others)


def _pick_kind(rng: np.random.Generator, state: Sequence[Obj], i: int) -> str:
    """A move (50%), size change (25%) or visibility change (25%) that fits; the next if not."""
    start = int(rng.choice(3, p=_KIND_P))
    for category in (start, *(c for c in (0, 1, 2) if c != start)):
        if category == 0:
            ok = [k for k in _STEP if _feasible(state, i, k)]
            if ok:
                return str(_pick(rng, ok))
        elif category == 1:
            kind = "grow" if state[i].size == "small" else "shrink"
            if _feasible(state, i, kind):
                return kind
        else:
            return "appear" if rng.random() < 0.5 else "disappear"
    raise AssertionError("unreachable: a visibility change always fits")


def _windows(n_events: int, frames: int) -> list[tuple[int, int]]:
    if n_events == 1:
        return [(0, frames - 1)]
    half = frames // 2
    return [(0, half - 1), (half, frames - 1)]


def _snap(v: float) -> float:
    return round(v * 2**16) / 2**16


def sample_clip(seed: int, split: str, index: int) -> Clip:
    """Clip ``index`` of ``split``: scene ``index``'s layout and 1-2 events on distinct objects."""
    return scene_clip(sample_scene(seed, split, index))


def scene_clip(scene: Scene) -> Clip:
    """The clip of a scene from :func:`sample_scene` (what :func:`sample_clip` returns)."""
    # on a 2**-16 grid, x + MOVE - MOVE == x: the reversed clip ends where this one starts
    grid = [dataclasses.replace(o, x=_snap(o.x), y=_snap(o.y)) for o in scene.objects]
    scene = dataclasses.replace(scene, objects=tuple(grid))
    rng = np.random.default_rng([*scene.entropy, _MOTION_STREAM])
    n_objects = len(scene.objects)
    n_events = 2 if n_objects > 1 and rng.random() < _TWO_EVENTS_P else 1
    state = list(scene.objects)
    events: list[Event] = []
    for start, end in _windows(n_events, CLIP_FRAMES):
        free = [i for i in range(n_objects) if all(e.object != i for e in events)]
        i = int(_pick(rng, free))
        kind = _pick_kind(rng, state, i)
        events.append(Event(kind, i, start, end))
        state[i] = _end_state(state[i], kind)
    return Clip(scene, tuple(events))


def reverse_clip(clip: Clip) -> Clip:
    """The clip played backwards: the last frame's layout, events flipped, in reverse order."""
    last = list(clip.scene.objects)
    for e in clip.events:
        last[e.object] = _end_state(last[e.object], e.kind)
    t = clip.frames - 1
    events = tuple(
        Event(REVERSE[e.kind], e.object, t - e.end, t - e.start) for e in reversed(clip.events)
    )
    return Clip(dataclasses.replace(clip.scene, objects=tuple(last)), events, clip.frames)


def object_states(clip: Clip) -> list[list[Obj | None]]:
    """Per frame, per object: its geometry at that frame, or None while hidden."""
    by_object = {e.object: e for e in clip.events}
    out: list[list[Obj | None]] = []
    for t in range(clip.frames):
        row: list[Obj | None] = []
        for i, obj in enumerate(clip.scene.objects):
            e = by_object.get(i)
            if e is None:
                row.append(obj)
                continue
            n, k = e.end - e.start, min(max(t - e.start, 0), e.end - e.start)
            if e.kind in ("appear", "disappear"):
                # visible in the second half of an appearance; n is odd, so never a tie
                shown = 2 * k > n if e.kind == "appear" else 2 * k < n
                row.append(obj if shown else None)
                continue
            end = _end_state(obj, e.kind)
            x, y, r = (
                (a * (n - k) + b * k) / n
                for a, b in ((obj.x, end.x), (obj.y, end.y), (obj.r, end.r))
            )
            size = min(SIZES, key=lambda z: abs(SIZES[z] - r))  # n is odd: never half-way
            row.append(dataclasses.replace(obj, x=x, y=y, r=r, size=size))
        out.append(row)
    return out


def render_clip(clip: Clip, image_size: int) -> np.ndarray:
    """uint8 frames [T,H,W,3]; every frame draws the scene's render noise (it is a still camera)."""
    frames = []
    for row in object_states(clip):
        shown = tuple(o for o in row if o is not None)
        frames.append(
            np.asarray(render(dataclasses.replace(clip.scene, objects=shown), image_size))
        )
    return np.stack(frames)


# ---------------------------------------------------------------------------------------------
# Words. Per language: each event kind as (verb, rest); "first" and "then" place the subject
# {a} (German puts the verb second after "dann"); present tense, so Russian verbs do not agree.

# fmt: off
MOTION_LEXICON: dict[str, dict[str, Any]] = {
    "en": {
        "kinds": {"move_left": ("moves", " left"), "move_right": ("moves", " right"),
                  "move_up": ("moves", " up"), "move_down": ("moves", " down"),
                  "grow": ("grows", ""), "shrink": ("shrinks", ""),
                  "appear": ("appears", ""), "disappear": ("disappears", "")},
        "first": "{a} {verb}{rest}", "then": ", then {a} {verb}{rest}",
    },
    "de": {
        "kinds": {"move_left": ("bewegt sich", " nach links"),
                  "move_right": ("bewegt sich", " nach rechts"),
                  "move_up": ("bewegt sich", " nach oben"),
                  "move_down": ("bewegt sich", " nach unten"),
                  "grow": ("wächst", ""), "shrink": ("schrumpft", ""),
                  "appear": ("erscheint", ""), "disappear": ("verschwindet", "")},
        "first": "{a} {verb}{rest}", "then": ", dann {verb} {a}{rest}",
    },
    "fr": {
        "kinds": {"move_left": ("se déplace", " vers la gauche"),
                  "move_right": ("se déplace", " vers la droite"),
                  "move_up": ("se déplace", " vers le haut"),
                  "move_down": ("se déplace", " vers le bas"),
                  "grow": ("grandit", ""), "shrink": ("rétrécit", ""),
                  "appear": ("apparaît", ""), "disappear": ("disparaît", "")},
        "first": "{a} {verb}{rest}", "then": ", puis {a} {verb}{rest}",
    },
    "ru": {
        "kinds": {"move_left": ("движется", " влево"), "move_right": ("движется", " вправо"),
                  "move_up": ("движется", " вверх"), "move_down": ("движется", " вниз"),
                  "grow": ("увеличивается", ""), "shrink": ("уменьшается", ""),
                  "appear": ("появляется", ""), "disappear": ("исчезает", "")},
        "first": "{a} {verb}{rest}", "then": ", затем {a} {verb}{rest}",
    },
    "es": {
        "kinds": {"move_left": ("se mueve", " hacia la izquierda"),
                  "move_right": ("se mueve", " hacia la derecha"),
                  "move_up": ("se mueve", " hacia arriba"),
                  "move_down": ("se mueve", " hacia abajo"),
                  "grow": ("crece", ""), "shrink": ("se encoge", ""),
                  "appear": ("aparece", ""), "disappear": ("desaparece", "")},
        "first": "{a} {verb}{rest}", "then": " y luego {a} {verb}{rest}",
    },
}
# fmt: on


def narrate(clip: Clip, lang: str) -> str:
    """The clip's caption in one language: its events in order, objects by colour and shape."""
    if lang not in MOTION_LEXICON:
        raise ValueError(f"unknown language {lang!r}; choices: {', '.join(MOTION_LEXICON)}")
    lex, words = LEXICON[lang], MOTION_LEXICON[lang]
    parts = []
    for n, e in enumerate(clip.events):
        verb, rest = words["kinds"][e.kind]
        a = _definite(lex, clip.scene.objects[e.object], "nom")
        parts.append(words["first" if n == 0 else "then"].format(a=a, verb=verb, rest=rest))
    text = "".join(parts)
    for pattern, repl in lex["definite"].get("contract", ()):
        text = re.sub(pattern, repl, text)
    return text[0].upper() + text[1:] + "."


def clip_captions(clip: Clip, languages: Sequence[str]) -> dict[str, str]:
    """The clip's caption in each requested language."""
    return {lang: narrate(clip, lang) for lang in languages}


def clip_record(clip: Clip, image_size: int, languages: Sequence[str]) -> dict[str, Any]:
    """The ``json`` member of a video sample (also the features view's, without ``objects``)."""
    states = object_states(clip)
    return {
        "key": clip.key,
        "split": clip.scene.split,
        "width": image_size,
        "height": image_size,
        "frames": clip.frames,
        "fps": CLIP_FPS,
        "captions": clip_captions(clip, languages),
        "reversed_captions": clip_captions(reverse_clip(clip), languages),
        "events": [dataclasses.asdict(e) for e in clip.events],
        "objects": [
            {
                "shape": o.shape,
                "color": o.color,
                "size": o.size,
                "label": SHAPES.index(o.shape),
                "color_label": list(COLORS).index(o.color),
                "boxes": [None if row[i] is None else object_box(row[i]) for row in states],
            }
            for i, o in enumerate(clip.scene.objects)
        ],
    }


# ---------------------------------------------------------------------------------------------
# Video QA (English, as the image VQA view)

_Posed = tuple[str, str, str, str, Sequence[str], Sequence[str]]
_DIRECTIONS = {"move_left": "left", "move_right": "right", "move_up": "up", "move_down": "down"}
_HAPPENS = {
    **{k: "moves" for k in _DIRECTIONS},
    "grow": "grows",
    "shrink": "shrinks",
    "appear": "appears",
    "disappear": "disappears",
}
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five")


def _name(obj: Obj) -> str:
    return f"{obj.color} {obj.shape}"


def _ask_direction(rng: np.random.Generator, clip: Clip) -> _Posed | None:
    moves = [e for e in clip.events if e.kind in _DIRECTIONS]
    if not moves:
        return None
    e = _pick(rng, moves)
    answer, opposite = _DIRECTIONS[e.kind], _DIRECTIONS[REVERSE[e.kind]]
    # _annotate draws mistakes uniformly: the opposite (as if played backwards) is half of them
    others = [d for d in _DIRECTIONS.values() if d not in (answer, opposite)]
    mistakes = [opposite, opposite, *others]
    obj = clip.scene.objects[e.object]
    return (
        f"Which way does the {_name(obj)} move?",
        answer,
        "other",
        "which way does the",
        mistakes,
        (),
    )


def _ask_change(rng: np.random.Generator, clip: Clip) -> _Posed:
    """ "What happens to the blue square?": an object with an event, or (20%) one without."""
    changed = {e.object: e for e in clip.events}
    still = [i for i in range(len(clip.scene.objects)) if i not in changed]
    if still and rng.random() < 0.2:
        i, answer, mistakes = int(_pick(rng, still)), "nothing", ["moves"]
    else:
        e = changed[int(_pick(rng, sorted(changed)))]
        i, answer = e.object, _HAPPENS[e.kind]
        mistakes = ["nothing"] if e.kind in _DIRECTIONS else [_HAPPENS[REVERSE[e.kind]]]
    obj = clip.scene.objects[i]
    return (
        f"What happens to the {_name(obj)}?",
        answer,
        "other",
        "what happens to the",
        mistakes,
        (),
    )


def _ask_order(rng: np.random.Generator, clip: Clip) -> _Posed | None:
    """ "Does the red circle change before the blue square?": yes or no, equal odds."""
    if len(clip.events) < 2:
        return None
    first, second = (clip.scene.objects[e.object] for e in clip.events)
    answer = "yes" if rng.random() < 0.5 else "no"
    a, b = (first, second) if answer == "yes" else (second, first)
    wrong = "no" if answer == "yes" else "yes"
    return (
        f"Does the {_name(a)} change before the {_name(b)}?",
        answer,
        "yes/no",
        "does the",
        (wrong,),
        (),
    )


def _ask_count(rng: np.random.Generator, clip: Clip) -> _Posed:
    """ "How many shapes are there at the end?": appearing and disappearing shapes count."""
    states = object_states(clip)
    when, row = ("start", states[0]) if rng.random() < 0.5 else ("end", states[-1])
    n = sum(o is not None for o in row)
    mistakes = [str(m) for m in (n - 1, n + 1) if m >= 0]
    return (
        f"How many shapes are there at the {when}?",
        str(n),
        "number",
        "how many",
        mistakes,
        (_NUMBER_WORDS[n],),
    )


_VIDEO_QUESTION_KINDS: tuple[Callable[[np.random.Generator, Clip], _Posed | None], ...] = (
    _ask_direction,
    _ask_change,
    _ask_order,
    _ask_count,
)


def video_questions(clip: Clip) -> list[VqaQuestion]:
    """2-3 questions of different kinds; ids are ``scene.index * 10 + k`` as in the VQA view."""
    rng = np.random.default_rng([*clip.scene.entropy, _VIDEO_QA_STREAM])
    n = int(rng.integers(2, 4))
    posed = []
    for i in rng.permutation(len(_VIDEO_QUESTION_KINDS)):
        got = _VIDEO_QUESTION_KINDS[i](rng, clip)
        if got is not None:
            posed.append(got)
        if len(posed) == n:
            break
    out = []
    for k, p in enumerate(posed):
        answers, confidences = _annotate(rng, p)
        assert len(answers) == _N_ANSWERS
        out.append(
            VqaQuestion(
                clip.scene.index * 10 + k,
                p[0],
                p[1],
                p[2],
                p[3],
                tuple(answers),
                tuple(confidences),
            )
        )
    return out


def video_qa_record(clip: Clip, q: VqaQuestion) -> dict[str, Any]:
    """The ``json`` of a video QA sample: the VQA layout plus the clip's key and language."""
    return qa_record(q, ("video_id", clip.key), language="en")
