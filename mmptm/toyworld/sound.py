"""Sound: what a scene sounds like, and a built-in speech synthesiser for spoken captions.

**Scene sound** (:func:`scene_sound`): 1 s of mono audio at 16 kHz in which every object plays
one note of 0.4 s. Each attribute is audible on its own axis:

- colour → pitch (:data:`PITCHES`): a whole-tone scale from middle C in rainbow order, red
  lowest and purple highest. Notes are two semitones apart and all lie within one octave, so
  every harmonic of every note lies above every fundamental: the band 250-480 Hz holds
  nothing but fundamentals.
- shape → timbre (:data:`TIMBRES`): circle a sine, square odd harmonics (a square wave),
  triangle all harmonics at 1/k (sawtooth-like), diamond plucked (all harmonics, higher ones
  dying faster), star a bell (inharmonic partials 1, 2.76, 5.40, 8.93).
- size → loudness (:data:`LOUDNESS`): every note has the same RMS for its size, a large
  object's three times a small one's (9.5 dB).
- x position → onset: ``ONSET_SPAN * x`` seconds, so the leftmost object sounds first. The
  vertical position is not audible.

A seeded noise floor (:data:`SCENE_NOISE`) comes from the scene's own stream, so a scene
always sounds the same; each of the 30 (shape, colour) notes is made once (fixed random
partial phases) and scaled by size.

**Speech** (:func:`speak`): a formant synthesiser in vectorised numpy that needs nothing
installed. Every letter or other alphanumeric character of a word is one sound (a *phone*):
vowels are voiced, shaped by two main formants (F1, F2, plus F3) on a Rosenberg glottal
pulse train at the language's speaker pitch (:func:`speaker_pitch`, falling over the
utterance with a small rise on every word); sonorants are quieter voiced sounds with low
formants; fricatives are band-passed noise (voiced ones add a low murmur); stops and
affricates are a closure followed by a noise burst. Latin (with diacritics) and Cyrillic
letters have phones modelled on their usual sounds; any other character gets a phone drawn
from a hash of its code point, so any script speaks. Phones last 55-85 ms (soft and hard
signs 35, ß 100; jittered by up to 8%, on whole milliseconds), words are separated by
pauses (120 ms; longer after a comma or a full stop), and the waveform is exactly zero
between words before a faint noise floor is added, so the word boundaries returned are exact
(:class:`Speech`). ``voice="espeak"`` speaks through ``espeak-ng`` when it is installed: one
call per caption with a long break between words, cut at those silences and re-spaced like
the built-in voice.

Synthesis (``_synthesise``): gains and pitch are laid out per millisecond (5 ms ramps between
phones) and interpolated to samples; the voiced source (a glottal pulse per period, from a
table) and the noise source are gated by them, then filtered frame by frame in the STFT
domain (frames of 32 ms, hop 16 ms) by each frame's spectral envelope: a cascade of formant
resonances for the voiced part, a Gaussian band for the noise. Formant tracks are smoothed
over 3 frames, which gives consonant-vowel transitions. About 20 ms for a caption of 8 s on
one core.

Legend: S samples, M milliseconds, P partials, G segments (a phone is 1-2 segments, a pause
one), F STFT frames, K frequency bins.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import unicodedata
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from mmptm.toyworld.scene import COLORS, SHAPES, SIZES, Obj, Scene

SAMPLE_RATE = 16_000
SCENE_SECONDS = 1.0
NOTE_SECONDS = 0.4
ONSET_SPAN = 0.6  # onset (s) = ONSET_SPAN * x: x in (0, 1) left to right
#: colour -> fundamental (Hz): the whole-tone scale C4 D4 E4 F#4 G#4 A#4, rainbow order
PITCHES: dict[str, float] = {
    "red": 261.63,
    "orange": 293.66,
    "yellow": 329.63,
    "green": 369.99,
    "blue": 415.30,
    "purple": 466.16,
}
#: shape -> what its note is made of
TIMBRES: dict[str, str] = {
    "circle": "sine",
    "square": "odd harmonics at 1/k (square wave)",
    "triangle": "all harmonics at 1/k (sawtooth)",
    "diamond": "plucked: all harmonics at 1/k, the k-th decaying at 6 + 3k per second",
    "star": "bell: inharmonic partials 1, 2.76, 5.40, 8.93",
}
#: size -> RMS of the object's note
LOUDNESS: dict[str, float] = {"small": 0.025, "large": 0.075}
SCENE_NOISE = 0.002  # RMS of the white noise floor (-54 dBFS)
#: the audio view's class labels: ``label`` is the object count, one of these names
COUNT_LABELS = ("1", "2", "3", "4")
VOICES = ("builtin", "espeak")
_SOUND_STREAM = 9  # extra entropy words, as for NLI, the detector, VQA, statements and motion
_SPEECH_STREAM = 10
_MAX_PARTIAL_HZ = 7000.0

assert set(PITCHES) == set(COLORS) and set(TIMBRES) == set(SHAPES) and set(LOUDNESS) == set(SIZES)


# ---------------------------------------------------------------------------------------------
# Scene sound


def _partials(shape: str, f0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(frequency ratios [P], amplitudes [P], decay rates 1/s [P], attack s) of a shape's note.

    Attacks are short (8 ms for the plucked and bell notes) but not instant: a click would
    spread over every pitch band."""
    k = np.arange(1, int(_MAX_PARTIAL_HZ // f0) + 1, dtype=np.float64)
    if shape == "circle":
        return np.ones(1), np.ones(1), np.zeros(1), 0.03
    if shape == "square":
        odd = k[k % 2 == 1]
        return odd, 1 / odd, np.zeros_like(odd), 0.015
    if shape == "triangle":
        return k, 1 / k, np.full_like(k, 1.5), 0.015
    if shape == "diamond":
        return k, 1 / k, 6 + 3 * k, 0.008
    if shape == "star":
        ratios = np.array([1.0, 2.76, 5.40, 8.93])
        return ratios, np.array([1.0, 0.6, 0.4, 0.3]), np.array([3.0, 5.0, 8.0, 12.0]), 0.008
    raise ValueError(f"unknown shape {shape!r}; choices: {', '.join(SHAPES)}")


@cache
def _unit_note(shape: str, color: str) -> np.ndarray:
    """A (shape, colour)'s note at RMS 1, read-only float64 [NOTE_SECONDS * SAMPLE_RATE].

    Partial phases are drawn once per (shape, colour), so there are only 30 notes to make.
    """
    f0 = PITCHES[color]
    ratios_P, amps_P, decays_P, attack = _partials(shape, f0)
    t_S = np.arange(int(NOTE_SECONDS * SAMPLE_RATE)) / SAMPLE_RATE
    rng = np.random.default_rng([_SOUND_STREAM, SHAPES.index(shape), list(COLORS).index(color)])
    phases_P = rng.uniform(0, 2 * np.pi, size=len(ratios_P))
    partials_PS = np.sin(2 * np.pi * f0 * ratios_P[:, None] * t_S + phases_P[:, None])
    partials_PS *= amps_P[:, None] * np.exp(-decays_P[:, None] * t_S)
    release = 0.05
    ramp_S = np.clip(np.minimum(t_S / attack, (NOTE_SECONDS - t_S) / release), 0.0, 1.0)
    env_S = 0.5 - 0.5 * np.cos(np.pi * ramp_S)  # raised-cosine fades: no clicks
    wave_S = partials_PS.sum(0) * env_S
    wave_S /= np.sqrt(np.mean(wave_S**2))
    wave_S.flags.writeable = False
    return wave_S


def note(obj: Obj) -> np.ndarray:
    """The object's note: float64 [NOTE_SECONDS * SAMPLE_RATE], RMS ``LOUDNESS[size]``."""
    return _unit_note(obj.shape, obj.color) * LOUDNESS[obj.size]


def onset(obj: Obj) -> float:
    """When the object's note starts (s): left to right over the first ONSET_SPAN seconds."""
    return ONSET_SPAN * obj.x


def scene_sound(scene: Scene) -> np.ndarray:
    """What the scene sounds like: float32 [SCENE_SECONDS * SAMPLE_RATE] in [-1, 1]."""
    rng = np.random.default_rng([*scene.entropy, _SOUND_STREAM])
    n = int(SCENE_SECONDS * SAMPLE_RATE)
    wave_S = np.zeros(n)
    for obj in scene.objects:
        start = round(onset(obj) * SAMPLE_RATE)
        wave = note(obj)[: n - start]
        wave_S[start : start + len(wave)] += wave
    wave_S += rng.normal(0.0, SCENE_NOISE, size=n)
    return np.clip(wave_S, -1.0, 1.0).astype(np.float32)


def loudest(scene: Scene) -> Obj:
    """The loudest object: a large one if any, the leftmost (first to sound) among equals."""
    return next(o for size in ("large", "small") for o in scene.objects if o.size == size)


def sound_labels(scene: Scene) -> dict[str, Any]:
    """Class labels of a scene's sound: ``count``, ``loudest_color`` and ``label`` (= count,
    one of :data:`COUNT_LABELS`, for the ``label`` plug-in)."""
    count = len(scene.objects)
    return {"count": count, "loudest_color": loudest(scene).color, "label": str(count)}


# ---------------------------------------------------------------------------------------------
# Phones: what each character sounds like


@dataclass(frozen=True)
class Phone:
    """One character's sound. ``kind``: vowel, sonorant, glide, fricative, stop, affricate.

    ``formants`` (F1, F2, F3 in Hz) shape the voiced part (gain ``voice``); ``noise`` is the
    gain of noise in a Gaussian band at ``fc`` Hz, ``bw`` wide (for a stop or an affricate:
    its release, after a closure that keeps only ``voice``).
    """

    kind: str
    formants: tuple[float, float, float] = (500.0, 1500.0, 2500.0)
    voice: float = 0.0
    noise: float = 0.0
    fc: float = 3000.0
    bw: float = 1000.0
    ms: int = 70
    trill: bool = False


def _vowel(f1: float, f2: float, f3: float) -> Phone:
    return Phone("vowel", (f1, f2, f3), voice=1.0, ms=85)


def _sonorant(f1: float, f2: float, f3: float, voice: float = 0.5, **kw: Any) -> Phone:
    return Phone("sonorant", (f1, f2, f3), voice=voice, ms=65, **kw)


def _glide(f1: float, f2: float, f3: float, ms: int = 55) -> Phone:
    return Phone("glide", (f1, f2, f3), voice=0.6, ms=ms)


def _fricative(fc: float, bw: float, noise: float, voiced: bool = False, ms: int = 80) -> Phone:
    return Phone(
        "fricative", (260.0, 1400.0, 2500.0), voice=0.3 if voiced else 0.0, noise=noise,
        fc=fc, bw=bw, ms=ms,
    )  # fmt: skip


def _stop(fc: float, bw: float, voiced: bool, kind: str = "stop", ms: int = 65) -> Phone:
    noise = 0.45 if kind == "stop" else 0.7
    return Phone(
        kind, (220.0, 1200.0, 2400.0), voice=0.15 if voiced else 0.0, noise=noise, fc=fc,
        bw=bw, ms=ms,
    )  # fmt: skip


# fmt: off
_LATIN: dict[str, Phone] = {
    "a": _vowel(730, 1250, 2500), "e": _vowel(480, 1900, 2550), "i": _vowel(300, 2250, 2950),
    "o": _vowel(480, 900, 2450), "u": _vowel(330, 800, 2300), "y": _vowel(300, 1750, 2400),
    "æ": _vowel(680, 1700, 2450), "œ": _vowel(450, 1500, 2400), "ø": _vowel(400, 1550, 2350),
    "m": _sonorant(260, 1100, 2300, 0.45), "n": _sonorant(260, 1650, 2600, 0.45),
    "l": _sonorant(380, 1250, 2700, 0.6), "r": _sonorant(450, 1250, 1700, 0.55, trill=True),
    "w": _glide(300, 700, 2200), "j": _glide(280, 2250, 2900),
    "f": _fricative(5500, 2000, 0.35), "v": _fricative(5000, 2000, 0.2, voiced=True),
    "s": _fricative(5200, 900, 0.8), "z": _fricative(5000, 900, 0.5, voiced=True),
    "h": _fricative(1600, 1400, 0.4, ms=60), "x": _fricative(2600, 900, 0.6),
    "ß": _fricative(5200, 900, 0.8, ms=100),
    "p": _stop(900, 700, False), "b": _stop(900, 700, True),
    "t": _stop(4000, 1300, False), "d": _stop(4000, 1300, True),
    "k": _stop(1900, 500, False), "g": _stop(1900, 500, True),
    "c": _stop(2300, 700, False), "q": _stop(1500, 500, False),
}
_CYRILLIC: dict[str, Phone] = {
    "а": _LATIN["a"], "б": _LATIN["b"], "в": _LATIN["v"], "г": _LATIN["g"], "д": _LATIN["d"],
    "е": _vowel(450, 2000, 2600), "ё": _vowel(470, 1100, 2400),
    "ж": _fricative(2600, 900, 0.5, voiced=True), "з": _LATIN["z"], "и": _LATIN["i"],
    "й": _glide(280, 2300, 2950), "к": _LATIN["k"], "л": _LATIN["l"], "м": _LATIN["m"],
    "н": _LATIN["n"], "о": _LATIN["o"], "п": _LATIN["p"], "р": _LATIN["r"], "с": _LATIN["s"],
    "т": _LATIN["t"], "у": _LATIN["u"], "ф": _LATIN["f"], "х": _fricative(1500, 700, 0.5),
    "ц": _stop(5000, 900, False, "affricate", 80), "ч": _stop(3000, 900, False, "affricate", 80),
    "ш": _fricative(2800, 900, 0.7), "щ": _fricative(3500, 1200, 0.7, ms=90),
    "ъ": _glide(400, 1000, 2400, ms=35), "ы": _vowel(400, 1500, 2450),
    "ь": _glide(300, 2200, 2900, ms=35), "э": _vowel(550, 1750, 2500),
    "ю": _vowel(330, 1200, 2300), "я": _vowel(650, 1600, 2500),
}
# a combining mark moves a vowel's (F1, F2) (and a consonant's noise band by twice dF2):
# acute, grave, circumflex, tilde, breve, ring, diaeresis, caron, cedilla
_MARKS: dict[int, tuple[float, float]] = {
    0x301: (-30, 150), 0x300: (40, -120), 0x302: (30, -200), 0x303: (0, -100),
    0x306: (-30, 250), 0x30A: (20, -300), 0x308: (-40, 550), 0x30C: (0, 200), 0x327: (0, 600),
}
# fmt: on
_PHONES = {**_LATIN, **_CYRILLIC}
_HASH_KINDS = ("vowel", "vowel", "sonorant", "fricative", "stop")


def _hashed(ch: str) -> Phone:
    """A phone for a character of no table (another script, a digit), fixed by its code point."""
    h = zlib.crc32(ch.encode("utf-8"))
    kind = _HASH_KINDS[h % len(_HASH_KINDS)]
    f1 = 280.0 + 70 * ((h >> 3) % 8)
    f2 = max(800.0 + 100 * ((h >> 6) % 16), f1 + 300)
    fc, bw = 1500.0 + 450 * ((h >> 10) % 12), 500.0 + 250 * ((h >> 14) % 4)
    voiced = bool((h >> 16) & 1)
    if kind == "vowel":
        return _vowel(f1, f2, 2500 + 50 * ((h >> 17) % 8))
    if kind == "sonorant":
        return _sonorant(min(f1, 400), f2, 2600)
    if kind == "fricative":
        return _fricative(fc, bw, 0.6, voiced=voiced)
    return _stop(fc, bw, voiced)


def phone(ch: str) -> Phone:
    """The sound of one character (any alphanumeric one; case and diacritics are read)."""
    low = ch.lower()
    if low in _PHONES:
        return _PHONES[low]
    parts = unicodedata.normalize("NFD", low)
    base = _PHONES.get(parts[0]) or _hashed(parts[0])
    d1 = d2 = 0.0
    for mark in parts[1:]:
        m1, m2 = _MARKS.get(ord(mark), (0.0, 0.0))
        if ord(mark) not in _MARKS:  # an unknown mark: a shift fixed by its code point
            h = zlib.crc32(mark.encode("utf-8"))
            m1, m2 = 20.0 * (h % 7 - 3), 80.0 * ((h >> 3) % 9 - 4)
        d1, d2 = d1 + m1, d2 + m2
    if not d1 and not d2:
        return base
    f1, f2, f3 = base.formants
    formants = (max(200.0, f1 + d1), max(f1 + d1 + 300, f2 + d2), f3)
    fc = float(np.clip(base.fc + 2 * d2, 800, 7000))
    return Phone(base.kind, formants, base.voice, base.noise, fc, base.bw, base.ms, base.trill)


# ---------------------------------------------------------------------------------------------
# Speech

#: speaker pitch (Hz) per language; others get one from a hash of the code
SPEAKERS: dict[str, float] = {"en": 110.0, "de": 125.0, "fr": 205.0, "ru": 140.0, "es": 185.0}
WORD_GAP_MS = 120
_PAUSE_MS = {",": 250, ";": 250, ":": 250, ".": 350, "!": 350, "?": 350}
LEAD_MS, TAIL_MS = 150, 200
SPEECH_RMS = 0.08  # RMS over the words
SPEECH_NOISE = 1e-4  # noise floor (-80 dBFS): all there is between words
_FRAME, _HOP = 512, 256  # STFT frame and hop in samples (32 ms, 16 ms)
_RAMP = 80  # samples (5 ms) of fade at a word's edges, inside the word


def speaker_pitch(lang: str) -> float:
    """The language's speaker pitch (Hz)."""
    return SPEAKERS.get(lang, 100.0 + zlib.crc32(lang.encode("utf-8")) % 120)


@dataclass(frozen=True)
class Speech:
    """A spoken text: mono float32 ``wave`` [S] at ``rate``; ``words`` as (word, start_s, end_s),
    silence (noise floor only) outside them."""

    wave: np.ndarray
    rate: int
    words: tuple[tuple[str, float, float], ...]


_TOKEN = re.compile(r"\S+")
_EDGE = re.compile(r"^[\W_]+|[\W_]+$")


def words(text: str) -> list[tuple[str, int]]:
    """(word, pause after it in ms) per spoken word: whitespace tokens with the punctuation at
    their ends stripped (kept inside: "d'un", "au-dessus"); tokens without a letter or digit
    are not words."""
    out: list[tuple[str, int]] = []
    for token in _TOKEN.findall(text):
        word = _EDGE.sub("", token)
        if not word:
            continue
        tail = token[token.rindex(word[-1]) + 1 :]
        out.append((word, max([WORD_GAP_MS, *(_PAUSE_MS.get(c, 0) for c in tail)])))
    return out


# Segment columns: ms, voice, noise, F1, F2, F3, fc, bw, trill, word (-1: a pause)
_Segment = tuple[int, float, float, float, float, float, float, float, float, int]
_MS = SAMPLE_RATE // 1000  # samples per millisecond: segments last whole milliseconds


def _phone_segments(p: Phone, ms: int, word: int, scale: float) -> list[_Segment]:
    f1, f2, f3 = (f * scale for f in p.formants)
    trill = 1.0 if p.trill else 0.0
    if p.kind in ("stop", "affricate"):
        closure = (ms * (55 if p.kind == "stop" else 40)) // 100
        return [
            (closure, p.voice, 0.0, f1, f2, f3, p.fc, p.bw, 0.0, word),
            (ms - closure, p.voice, p.noise, f1, f2, f3, p.fc, p.bw, 0.0, word),
        ]
    return [(ms, p.voice, p.noise, f1, f2, f3, p.fc, p.bw, trill, word)]


def _layout(text: str, f0: float, rng: np.random.Generator) -> tuple[list[_Segment], list[str]]:
    """The segments of a text (pauses with word -1) and its words."""
    scale = (f0 / 120.0) ** 0.2  # higher voices, shorter vocal tracts
    segs: list[_Segment] = [(LEAD_MS, 0.0, 0.0, 500.0, 1500.0, 2500.0, 3000.0, 1000.0, 0.0, -1)]
    spoken = words(text)
    for w, (word, gap_ms) in enumerate(spoken):
        chars = [c for c in word if c.isalnum()]
        jitter = rng.uniform(-0.08, 0.08, size=len(chars))
        for ch, j in zip(chars, jitter):
            p = phone(ch)
            segs += _phone_segments(p, round(p.ms * (1 + j)), w, scale)
        ms = TAIL_MS if w == len(spoken) - 1 else gap_ms
        segs.append((ms, 0.0, 0.0, *segs[-1][3:8], 0.0, -1))  # a pause holds the formants
    return segs, [w for w, _ in spoken]


def _word_spans(segs: list[_Segment]) -> list[tuple[int, int]]:
    """(first sample, end sample) of every word, in order."""
    bounds = np.cumsum([0] + [s[0] * _MS for s in segs])
    spans: dict[int, list[int]] = {}
    for i, s in enumerate(segs):
        if s[9] >= 0:
            spans.setdefault(s[9], [int(bounds[i]), 0])[1] = int(bounds[i + 1])
    return [(a, b) for a, b in (spans[w] for w in sorted(spans))]


def _moving_average(x: np.ndarray, width: int) -> np.ndarray:
    """Centred moving average over ``width`` (odd) rows of ``x``, edges held."""
    half = width // 2
    c = np.cumsum(np.pad(x, [(half + 1, half)] + [(0, 0)] * (x.ndim - 1), mode="edge"), axis=0)
    return (c[width:] - c[:-width]) / width


def _upsample(x_M: np.ndarray) -> np.ndarray:
    """Per-millisecond values [M] -> per sample [M * _MS], linearly from each to the next."""
    nxt = np.append(x_M[1:], x_M[-1])
    return (x_M[:, None] + (nxt - x_M)[:, None] * (np.arange(_MS) / _MS)).reshape(-1)


def _glottal_table(n: int = 2048, rise: float = 0.4, fall: float = 0.16) -> np.ndarray:
    """The voiced source over one period: the derivative of a Rosenberg glottal flow pulse
    (opens smoothly, closes abruptly), ``n`` phase steps."""
    phi = np.arange(n + 1) / n
    opening = 0.5 * (1 - np.cos(np.pi * phi / rise))
    closing = np.cos(np.pi * (phi - rise) / (2 * fall))
    flow = np.where(phi < rise, opening, np.where(phi < rise + fall, closing, 0.0))
    return (np.diff(flow) * n).astype(np.float32)


_GLOTTAL = _glottal_table()


def _frames(x_S: np.ndarray, window: np.ndarray) -> np.ndarray:
    """Windowed frames [F, _FRAME] every _HOP samples; frame f is centred on sample f*_HOP."""
    padded = np.pad(x_S, (_FRAME // 2, _FRAME // 2 + (-len(x_S)) % _HOP))
    return np.lib.stride_tricks.sliding_window_view(padded, _FRAME)[::_HOP] * window


def _overlap_add(frames_FN: np.ndarray, n: int) -> np.ndarray:
    """Inverse of :func:`_frames` for a window that sums to 1 at _HOP: first ``n`` samples."""
    f, q = len(frames_FN), _FRAME // _HOP
    out = np.zeros((f + q - 1) * _HOP, dtype=frames_FN.dtype)
    for j in range(q):
        out[j * _HOP : (j + f) * _HOP] += frames_FN[:, j * _HOP : (j + 1) * _HOP].reshape(-1)
    return out[_FRAME // 2 : _FRAME // 2 + n]


_WINDOW = np.hanning(_FRAME + 1)[:-1].astype(np.float32)  # periodic Hann: sums to 1 at hop N/2
_FREQ_K = np.fft.rfftfreq(_FRAME, 1 / SAMPLE_RATE).astype(np.float32)
_SOURCE_K = 1.0 / (1.0 + _FREQ_K / 200.0)  # the voiced source's falling spectrum
_BANDWIDTHS = (80.0, 100.0, 150.0)
# noise gain 1 against voice gain 1: /s/ (0.8) about 12 dB below a vowel, /f/ (0.35) 20 dB
_NOISE_LEVEL = 5.0
_F4 = (3500.0, 250.0)  # a fixed fourth formant and its bandwidth


def _resonances(formants_F3: np.ndarray) -> np.ndarray:
    """Cascade of formant resonators (F1-F3 per frame, a fixed F4): magnitude [F, K]."""
    f2_K = _FREQ_K**2
    f4, b4 = _F4
    f4_K = f4**2 / np.sqrt((f4**2 - f2_K) ** 2 + b4**2 * f2_K)
    h_FK = np.tile(f4_K, (len(formants_F3), 1))
    for i, b in enumerate(_BANDWIDTHS):
        fi = formants_F3[:, i : i + 1] ** 2
        h_FK *= fi / np.sqrt((fi - f2_K) ** 2 + b**2 * f2_K)
    return h_FK


def _synthesise(
    segs: list[_Segment], spans: list[tuple[int, int]], f0: float, rng: np.random.Generator
) -> np.ndarray:
    """The waveform of a segment list, float32 [S], before gating and levels; ``spans``:
    each word's first and end sample. Tracks are built per millisecond (M), then per sample."""
    table_G = np.array(segs, dtype=np.float32)
    ms_G = np.array([s[0] for s in segs])
    seg_M = np.repeat(np.arange(len(segs)), ms_G)
    n_ms = len(seg_M)
    t_M = np.arange(n_ms, dtype=np.float32) / 1000
    # source gains: 5 ms (voice) and 3 ms (noise) ramps between segments; r trills at 28 Hz
    voice_M = _moving_average(table_G[seg_M, 1], 5)
    noise_M = _moving_average(table_G[seg_M, 2], 3) * _NOISE_LEVEL
    trill_M = table_G[seg_M, 8] > 0
    voice_M[trill_M] *= 0.6 + 0.4 * np.cos(2 * np.pi * 28 * t_M[trill_M])
    # pitch: declination over the utterance, a rise-fall on every word, a slow wander
    word_M = table_G[seg_M, 9].astype(np.int64)
    span_W2 = np.array([*spans, (0, 1)], dtype=np.float32) / _MS  # last row: pauses (word -1)
    pos_M = (np.arange(n_ms) - span_W2[word_M, 0]) / (span_W2[word_M, 1] - span_W2[word_M, 0])
    accent_M = np.where(word_M >= 0, np.sin(np.pi * np.clip(pos_M, 0, 1)), 0.0)
    knots = rng.uniform(-0.015, 0.015, size=n_ms // 200 + 2)
    wander_M = np.interp(t_M / 0.2, np.arange(len(knots)), knots)
    f0_M = f0 * (1.1 - 0.2 * t_M / t_M[-1]) * (1 + 0.06 * accent_M + wander_M)
    phase_S = np.cumsum(_upsample(f0_M.astype(np.float64))) / SAMPLE_RATE
    idx_S = ((phase_S % 1.0) * len(_GLOTTAL)).astype(np.int64)
    voiced_S = _GLOTTAL[idx_S] * _upsample(voice_M.astype(np.float32))
    noise_S = _upsample(noise_M.astype(np.float32))
    noisy_S = rng.standard_normal(len(idx_S), dtype=np.float32) * noise_S
    # filters per frame: formant and noise-band tracks smoothed over 3 frames (48 ms)
    v_FN, n_FN = _frames(voiced_S, _WINDOW), _frames(noisy_S, _WINDOW)
    centre_F = np.minimum(np.arange(len(v_FN)) * (_HOP // _MS), n_ms - 1)
    params_F5 = _moving_average(table_G[seg_M[centre_F], 3:8], 3)  # F1 F2 F3 fc bw
    hv_FK = _resonances(params_F5[:, :3])
    hv_FK /= np.sqrt(np.mean((hv_FK * _SOURCE_K) ** 2, axis=1, keepdims=True))
    hn_FK = np.exp(-0.5 * ((_FREQ_K - params_F5[:, 3:4]) / params_F5[:, 4:5]) ** 2)
    hn_FK /= np.sqrt(np.mean(hn_FK**2, axis=1, keepdims=True))
    spec_FK = np.fft.rfft(v_FN) * hv_FK + np.fft.rfft(n_FN) * hn_FK
    return _overlap_add(np.fft.irfft(spec_FK, n=_FRAME).astype(np.float32), len(idx_S))


def _finish(y_S: np.ndarray, spans: list[tuple[int, int]], rng: np.random.Generator) -> np.ndarray:
    """Zero outside the word spans (5 ms fades inside them), level, add the noise floor."""
    gate_S = np.zeros(len(y_S), dtype=np.float32)
    ramp = np.arange(1, _RAMP + 1, dtype=np.float32) / _RAMP
    for a, b in spans:
        r = min(_RAMP, (b - a) // 2)
        gate_S[a:b] = 1.0
        gate_S[a : a + r] = ramp[:r]
        gate_S[b - r : b] = ramp[:r][::-1]
    y_S = y_S.astype(np.float32) * gate_S
    level = np.sqrt(np.dot(y_S, y_S) / max(1, sum(b - a for a, b in spans)))
    if level > 0:
        y_S *= SPEECH_RMS / level
    y_S += rng.standard_normal(len(y_S), dtype=np.float32) * np.float32(SPEECH_NOISE)
    return np.clip(y_S, -1.0, 1.0)


def speak(text: str, lang: str, entropy: Sequence[int] = (), voice: str = "builtin") -> Speech:
    """``text`` spoken in ``lang``'s voice; the same arguments give the same samples.

    ``entropy``: seed words of the jitter and noise (a scene's :attr:`Scene.entropy`).
    ``voice``: ``builtin`` or ``espeak`` (needs ``espeak-ng`` on the PATH).
    """
    rng = np.random.default_rng([*entropy, _SPEECH_STREAM, zlib.crc32(lang.encode("utf-8"))])
    if voice == "espeak":
        return _espeak(text, lang, rng)
    if voice != "builtin":
        raise ValueError(f"unknown voice {voice!r}; choices: {', '.join(VOICES)}")
    f0 = speaker_pitch(lang)
    segs, names = _layout(text, f0, rng)
    if not names:
        raise ValueError(f"nothing to speak in {text!r}")
    spans = _word_spans(segs)
    y_S = _synthesise(segs, spans, f0, rng)
    wave = _finish(y_S, spans, rng)
    return Speech(wave, SAMPLE_RATE, _timed(names, spans))


def _timed(names: Sequence[str], spans: Sequence[tuple[int, int]]) -> tuple:
    return tuple((w, a / SAMPLE_RATE, b / SAMPLE_RATE) for w, (a, b) in zip(names, spans))


# ---------------------------------------------------------------------------------------------
# espeak-ng

_ESPEAK_BREAK_MS = 600  # between words in the SSML; cut where the output is this silent
_SILENT = 1e-3  # |sample| below this counts as silence in espeak-ng's output


def _espeak(text: str, lang: str, rng: np.random.Generator) -> Speech:
    """``text`` through ``espeak-ng``, words re-spaced as the built-in voice spaces them.

    One call per text, a long break after each word; the output is cut at those silences.
    If the cut finds another number of words (a word with a long silence inside), each
    word is spoken by a call of its own.
    """
    from xml.sax.saxutils import escape

    spoken = words(text)
    if not spoken:
        raise ValueError(f"nothing to speak in {text!r}")
    ssml = "".join(f"{escape(w)}<break time='{_ESPEAK_BREAK_MS}ms'/> " for w, _ in spoken)
    wave = _espeak_call(f"<speak>{ssml}</speak>", lang)
    pieces = _split_on_silence(wave, int(_ESPEAK_BREAK_MS * 0.6) * SAMPLE_RATE // 1000)
    if len(pieces) != len(spoken):
        pieces = [_trim(_espeak_call(escape(w), lang)) for w, _ in spoken]
    parts = [np.zeros(LEAD_MS * SAMPLE_RATE // 1000)]
    spans, at = [], len(parts[0])
    for piece, (_, gap_ms) in zip(pieces, spoken):
        spans.append((at, at + len(piece)))
        parts.append(piece)
        parts.append(np.zeros(gap_ms * SAMPLE_RATE // 1000))
        at += len(piece) + len(parts[-1])
    parts[-1] = np.zeros(TAIL_MS * SAMPLE_RATE // 1000)
    y_S = np.concatenate(parts).astype(np.float64)
    return Speech(_finish(y_S, spans, rng), SAMPLE_RATE, _timed([w for w, _ in spoken], spans))


def _espeak_call(ssml: str, lang: str) -> np.ndarray:
    from mmptm.modalities.audio_io import read_audio, resample

    exe = shutil.which("espeak-ng")
    if exe is None:
        raise RuntimeError("voice 'espeak' needs espeak-ng on the PATH (apt install espeak-ng)")
    cmd = [exe, "-m", "-v", lang, "--stdout"]
    done = subprocess.run(cmd, input=ssml.encode("utf-8"), capture_output=True, check=False)
    if done.returncode != 0 or not done.stdout:
        err = done.stderr.decode("utf-8", "replace").strip()
        raise RuntimeError(f"espeak-ng -v {lang} failed ({done.returncode}): {err}")
    wave, rate = read_audio(done.stdout, "wav", f"espeak-ng -v {lang}")
    return resample(wave, rate, SAMPLE_RATE).astype(np.float64)


def _split_on_silence(wave_S: np.ndarray, min_gap: int) -> list[np.ndarray]:
    """The sounding stretches of ``wave_S`` separated by at least ``min_gap`` silent samples."""
    loud = np.flatnonzero(np.abs(wave_S) >= _SILENT)
    if not len(loud):
        return []
    breaks = np.flatnonzero(np.diff(loud) > min_gap)
    starts = np.r_[loud[0], loud[breaks + 1]]
    ends = np.r_[loud[breaks], loud[-1]] + 1
    return [wave_S[a:b] for a, b in zip(starts, ends)]


def _trim(wave_S: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(wave_S) >= _SILENT)
    if not len(loud):
        raise RuntimeError("espeak-ng gave silence for a word")
    return wave_S[loud[0] : loud[-1] + 1]


def espeak_available() -> bool:
    """Whether ``voice="espeak"`` can run here."""
    return shutil.which("espeak-ng") is not None


__all__ = [
    "COUNT_LABELS",
    "LOUDNESS",
    "PITCHES",
    "SAMPLE_RATE",
    "SPEAKERS",
    "TIMBRES",
    "VOICES",
    "Phone",
    "Speech",
    "espeak_available",
    "loudest",
    "note",
    "onset",
    "phone",
    "scene_sound",
    "sound_labels",
    "speak",
    "speaker_pitch",
    "words",
]
