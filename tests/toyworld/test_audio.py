"""toyworld audio: scene sounds heard back (pitch, loudness, onsets), speech timings, views.

The checks read the decoded FLAC (soundfile) with plain numpy spectra and energies, and the
json's objects and words; none calls back into the synthesiser to get its answer.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import webdataset as wds

from mmptm import toyworld as tw
from mmptm.cli import main as cli_main
from mmptm.modalities.audio_io import encode_audio
from mmptm.modalities.base import DataContext
from mmptm.modalities.labels import LabelData
from mmptm.toyworld import sound

SMALL = {"n_train": 30, "n_val": 5, "n_test": 5, "image_size": 32, "shard_size": 16}
LANGS = ("en", "ru")
RATE = 16_000


def _read(root: Path, paths: list[str]) -> list[dict]:
    return list(wds.WebDataset([str(root / p) for p in paths], shardshuffle=False))


def _decode(flac: bytes) -> np.ndarray:
    wave, rate = sf.read(io.BytesIO(flac), dtype="float64")
    assert rate == RATE and wave.ndim == 1
    return wave


def _all(manifest: dict, view: str) -> list[str]:
    return [p for split in tw.SPLITS for p in manifest["shards"][view][split]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("toyworld_audio")
    views = ("image_text", "audio", "speech")
    return root, tw.generate(root, seed=2, languages=LANGS, views=views, **SMALL)


@pytest.fixture(scope="module")
def audio(world: tuple[Path, dict]) -> list[dict]:
    root, manifest = world
    return _read(root, _all(manifest, "audio"))


@pytest.fixture(scope="module")
def speech(world: tuple[Path, dict]) -> list[dict]:
    root, manifest = world
    return _read(root, _all(manifest, "speech"))


# ---------------------------------------------------------------------------------------------
# Scene sounds


def _band(power_F: np.ndarray, hz: float, rel: float = 0.015) -> float:
    """Power within +-rel of ``hz`` in a spectrum of 1 Hz bins (a 1 s sound)."""
    return float(power_F[int(hz * (1 - rel)) : int(hz * (1 + rel)) + 2].sum())


def _unique_colours(objects: list[dict]) -> set[str]:
    colours = [o["color"] for o in objects]
    return {c for c in colours if colours.count(c) == 1}


def test_every_colour_is_heard_at_its_pitch(audio: list[dict]) -> None:
    assert len(audio) == sum(SMALL[f"n_{s}"] for s in tw.SPLITS)
    pitches = sorted(tw.PITCHES.values())
    assert min(b / a for a, b in itertools.pairwise(pitches)) > 1.1  # well apart
    assert pitches[-1] < 2 * pitches[0]  # within an octave: harmonics lie above them all
    for s in audio:
        wave = _decode(s["flac"])
        assert len(wave) == RATE and np.abs(wave).max() < 1.0
        power = np.abs(np.fft.rfft(wave)) ** 2
        objects = json.loads(s["json"])["objects"]
        present = {o["color"] for o in objects}
        heard = {c: _band(power, hz) for c, hz in tw.PITCHES.items()}
        quiet = max((heard[c] for c in tw.PITCHES if c not in present), default=0.0)
        assert min(heard[c] for c in present) > 5 * quiet, (s["__key__"], heard, present)


def _single(size: str, shape: str = "square", color: str = "blue") -> tw.Scene:
    obj = tw.Obj(shape, color, size, 0.5, 0.5, tw.SIZES[size])
    return tw.Scene("train000000", "train", 0, 0, (obj,))


def test_a_larger_object_is_louder(audio: list[dict]) -> None:
    for shape in tw.SHAPES:  # the same object, small then large
        small, large = (_decode(encode_audio(tw.scene_sound(_single(z, shape)), RATE))
                        for z in ("small", "large"))  # fmt: skip
        ratio = np.sqrt(np.mean(large**2) / np.mean(small**2))
        assert 2.5 < ratio < 3.5, (shape, ratio)
    pairs = 0
    for s in audio:  # within a scene: the larger object's note is stronger at its pitch
        objects = json.loads(s["json"])["objects"]
        power = np.abs(np.fft.rfft(_decode(s["flac"]))) ** 2
        unique = _unique_colours(objects)
        large = [o for o in objects if o["size"] == "large" and o["color"] in unique]
        small = [o for o in objects if o["size"] == "small" and o["color"] in unique]
        for a, b in itertools.product(large, small):
            big, little = (_band(power, tw.PITCHES[o["color"]]) for o in (a, b))
            assert big > 2 * little, (s["__key__"], a, b)
            pairs += 1
    assert pairs >= 5


def _onset(wave: np.ndarray, hz: float) -> float:
    """When the band around ``hz`` first reaches a quarter of its peak power (s): half the
    (symmetric) window over the note. The window is long (256 ms, bins of 3.9 Hz) and the band
    narrow, so the start of a loud neighbour one tone away does not spill into it."""
    n, hop = 4096, 32
    frames = np.lib.stride_tricks.sliding_window_view(np.pad(wave, n // 2), n)[::hop]
    power = np.abs(np.fft.rfft(frames * np.hanning(n))) ** 2
    k = np.fft.rfftfreq(n, 1 / RATE)
    band = power[:, np.abs(k - hz) < 0.01 * hz + 2].sum(1)
    return float(np.argmax(band >= 0.25 * band.max()) * hop / RATE)


def test_onsets_follow_left_to_right(audio: list[dict]) -> None:
    checked = 0
    for s in audio:
        wave = _decode(s["flac"])
        objects = json.loads(s["json"])["objects"]
        unique = _unique_colours(objects)
        heard = []
        for o in objects:
            if o["color"] not in unique:
                continue
            x = (o["box"][0] + o["box"][2]) / 2  # the box centre is the object's x
            t = _onset(wave, tw.PITCHES[o["color"]])
            assert abs(t - 0.6 * x) < 0.04, (s["__key__"], o, t)
            heard.append((x, t))
            checked += 1
        heard.sort()
        for (x0, t0), (x1, t1) in itertools.pairwise(heard):
            if x1 - x0 > 0.1:  # 60 ms apart: clearly in order
                assert t0 < t1, (s["__key__"], heard)
    assert checked >= 60


def test_same_key_same_samples(world: tuple[Path, dict], tmp_path: Path) -> None:
    root, manifest = world
    again = tw.generate(
        tmp_path, seed=2, languages=LANGS, views=("audio", "speech"), **{**SMALL, "n_train": 3}
    )
    for view in ("audio", "speech"):
        for split in ("val", "test"):  # scenes depend only on their coordinates
            first = _read(root, manifest["shards"][view][split])
            second = _read(tmp_path, again["shards"][view][split])
            assert [s["__key__"] for s in first] == [s["__key__"] for s in second]
            for a, b in zip(first, second):
                np.testing.assert_array_equal(_decode(a["flac"]), _decode(b["flac"]))
                assert a["json"] == b["json"]
    scene = tw.sample_scene(2, "val", 1)
    np.testing.assert_array_equal(tw.scene_sound(scene), tw.scene_sound(scene))
    other = tw.sample_scene(2, "val", 2)
    assert not np.array_equal(tw.scene_sound(scene), tw.scene_sound(other))
    text = tw.describe(scene, "de")
    one, two = tw.speak(text, "de", scene.entropy), tw.speak(text, "de", scene.entropy)
    np.testing.assert_array_equal(one.wave, two.wave)
    assert one.words == two.words
    assert not np.array_equal(one.wave, tw.speak(text, "de", other.entropy).wave)


# ---------------------------------------------------------------------------------------------
# Speech


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x**2))) if len(x) else 0.0


def _loud_runs(wave: np.ndarray, min_gap_s: float = 0.08) -> list[tuple[float, float]]:
    """(start, end) s of the stretches of 2 ms frames above 1% of the loudest frame's RMS,
    silences shorter than ``min_gap_s`` bridged."""
    hop = RATE // 500
    frames = wave[: len(wave) // hop * hop].reshape(-1, hop)
    rms = np.sqrt((frames**2).mean(1))
    loud = np.flatnonzero(rms > 0.01 * rms.max())
    breaks = np.flatnonzero(np.diff(loud) * hop / RATE > min_gap_s)
    starts, ends = np.r_[loud[0], loud[breaks + 1]], np.r_[loud[breaks], loud[-1]] + 1
    return [(a * hop / RATE, b * hop / RATE) for a, b in zip(starts, ends)]


def _check_timing(wave: np.ndarray, words: list, key: str) -> None:
    """Words hold the sound, the gaps between them only a faint noise floor."""
    edges = [0.0, *(t for _, a, b in words for t in (a, b)), len(wave) / RATE]
    gaps = [wave[int(a * RATE) : int(b * RATE)] for a, b in zip(edges[::2], edges[1::2])]
    inside = [wave[int(a * RATE) : int(b * RATE)] for _, a, b in words]
    floor = max(_rms(g) for g in gaps)
    assert floor < 1e-3, (key, floor)
    assert min(_rms(w) for w in inside) > 30 * floor, key
    runs = _loud_runs(wave)  # found from the waveform alone
    assert len(runs) == len(words), (key, runs, words)
    for (a, b), (word, start, end) in zip(runs, words):
        # a word may open with the closure of a stop (silent) and end on a faint release
        assert start - 0.003 <= a <= start + 0.06, (key, word, a, start)
        assert end - 0.06 <= b <= end + 0.003, (key, word, b, end)


def test_speech_words_lie_between_silences(speech: list[dict]) -> None:
    assert len(speech) == len(LANGS) * sum(SMALL[f"n_{s}"] for s in tw.SPLITS)
    for s in speech:
        meta = json.loads(s["json"])
        _check_timing(_decode(s["flac"]), meta["words"], s["__key__"])


def _tokens(text: str) -> list[str]:
    return [re.sub(r"^[\W_]+|[\W_]+$", "", t) for t in text.split()]


def test_speech_samples_speak_their_caption(world: tuple[Path, dict], speech: list[dict]) -> None:
    _, manifest = world
    for s in speech:
        meta = json.loads(s["json"])
        split = meta["split"]
        scene = tw.sample_scene(2, split, int(meta["scene"][len(split) :]))
        lang = meta["language"]
        caption = tw.describe(scene, lang)
        assert s["__key__"] == meta["key"] == f"{scene.key}_{lang}"
        assert s["txt"].decode("utf-8") == meta["caption"] == caption
        assert [w for w, _, _ in meta["words"]] == _tokens(caption)
        wave = _decode(s["flac"])
        assert meta["seconds"] == len(wave) / RATE and meta["sample_rate"] == RATE
        times = [t for _, a, b in meta["words"] for t in (a, b)]
        assert times == sorted(times) and times[0] > 0.1 and times[-1] < meta["seconds"] - 0.1
        for word, a, b in meta["words"]:  # 35-90 ms a character
            letters = sum(c.isalnum() for c in word)
            assert 0.035 * letters <= b - a <= 0.095 * letters, (word, a, b)
    for split in tw.SPLITS:
        sets = manifest["by_language"]["speech"][split]
        assert list(sets) == list(LANGS)
        for lang, got in sets.items():
            assert got["samples"] == SMALL[f"n_{split}"]
            assert all(p.startswith(f"speech/{split}-{lang}-") for p in got["shards"])


_OTHER_SCRIPTS = {
    "el": "Ένα μεγάλο μπλε τρίγωνο.",
    "ja": "大きな 青い 三角形",
    "ar": "مثلث أزرق كبير",
    "hi": "एक बड़ा नीला त्रिकोण",
}


def test_every_language_and_script_speaks() -> None:
    scene = tw.sample_scene(0, "test", 4)
    texts = {lang: tw.describe(scene, lang) for lang in tw.LANGUAGES}
    for lang, text in {**texts, **_OTHER_SCRIPTS}.items():
        got = tw.speak(text, lang, scene.entropy)
        assert got.rate == RATE and got.wave.dtype == np.float32
        assert np.isfinite(got.wave).all() and np.abs(got.wave).max() < 1.0
        assert [w for w, _, _ in got.words] == _tokens(text), lang
        _check_timing(got.wave.astype(np.float64), [list(w) for w in got.words], lang)
    # Cyrillic letters have phones of their own, case and all; others come from code points
    assert sound.phone("Ш") == sound.phone("ш") != sound.phone("щ")
    assert sound.phone("ё") != sound.phone("е")
    assert sound.phone("三") == sound.phone("三") != sound.phone("角")
    assert unicodedata.normalize("NFD", "é") != "é" and sound.phone("é") != sound.phone("e")
    # speaker pitch differs by language: the strongest low partial of a long vowel
    pitches = {}
    for lang in ("en", "fr"):
        wave = tw.speak("aaaaaaaa", lang).wave.astype(np.float64)
        power = np.abs(np.fft.rfft(wave * np.hanning(len(wave)))) ** 2
        hz = np.fft.rfftfreq(len(wave), 1 / RATE)
        pitches[lang] = hz[np.argmax(np.where((hz > 60) & (hz < 300), power, 0))]
    assert pitches["fr"] > 1.4 * pitches["en"], pitches


def _share(text: str, lo: float, hi: float, lang: str = "en") -> float:
    """The fraction of the spoken text's power between ``lo`` and ``hi`` Hz."""
    wave = tw.speak(text, lang).wave.astype(np.float64)
    power = np.abs(np.fft.rfft(wave)) ** 2
    hz = np.fft.rfftfreq(len(wave), 1 / RATE)
    return float(power[(hz >= lo) & (hz < hi)].sum() / power.sum())


def test_letters_sound_as_their_formants_say() -> None:
    # "i" has a high second formant (~2.2 kHz), "u" a low one (~0.8 kHz)
    assert _share("iiii", 1800, 2800) > 5 * _share("uuuu", 1800, 2800)
    assert _share("uuuu", 600, 1000) > 2 * _share("iiii", 600, 1000)
    assert _share("иии", 1800, 2800, "ru") > 5 * _share("ууу", 1800, 2800, "ru")
    # "s" is high noise, "m" a low murmur
    assert _share("ssss", 4000, 8000) > 0.5 > 0.01 > _share("mmmm", 4000, 8000)


# ---------------------------------------------------------------------------------------------
# Views, manifest, CLI


def test_audio_view_members_and_labels(world: tuple[Path, dict], audio: list[dict]) -> None:
    root, manifest = world
    images = {s["__key__"]: s for s in _read(root, _all(manifest, "image_text"))}
    labels = LabelData(
        LabelData.Config(names=list(tw.COUNT_LABELS)), views=["label"], context=DataContext()
    )
    for s in audio:
        assert set(s) - {"__key__", "__url__", "__local_path__"} == {"flac", "jpg", "txt", "json"}
        image = images[s["__key__"]]
        assert s["jpg"] == image["jpg"] and s["txt"] == image["txt"]
        meta = json.loads(s["json"])
        objects = meta["objects"]
        # image_text's record, but for the finer captions only image_text has
        record = json.loads(image["json"])
        finer = set(tw.CAPTION_FIELDS.values()) - {"captions"}
        assert finer <= set(record) and finer.isdisjoint(meta)
        record = {k: v for k, v in record.items() if k not in finer}
        assert {k: meta[k] for k in record} == record
        assert meta["count"] == len(objects) and meta["label"] == str(len(objects))
        large = [o["color"] for o in objects if o["size"] == "large"]
        assert meta["loudest_color"] == (large or [objects[0]["color"]])[0]
        got = labels.decode({}, meta, None)
        assert got == {"labels": len(objects) - 1}
    section = manifest["audio"]
    assert section["label"] == {"of": "count", "names": ["1", "2", "3", "4"]}
    assert section["sample_rate"] == RATE and section["voice"] == "builtin"
    assert section["pitches"] == tw.PITCHES
    for sample in _read(root, _all(manifest, "speech"))[:5]:
        assert set(sample) - {"__key__", "__url__", "__local_path__"} == {
            "flac", "jpg", "txt", "json"
        }  # fmt: skip
        assert sample["jpg"] == images[json.loads(sample["json"])["scene"]]["jpg"]


def test_cli_writes_the_audio_views(tmp_path: Path) -> None:
    out = tmp_path / "tw"
    common = ["data", "toyworld", "--out", str(out), "--n-train", "2", "--n-val", "1",
              "--n-test", "1", "--languages", "en,fr"]  # fmt: skip
    assert cli_main([*common, "--views", "speech,audio"]) == 0
    manifest = json.loads((out / "manifest.json").read_text("utf-8"))
    assert list(manifest["shards"]) == ["audio", "speech"]
    assert sorted(p.name for p in (out / "speech").glob("*.tar")) == [
        f"{split}-{lang}-000000.tar" for split in ("test", "train", "val") for lang in ("en", "fr")
    ]
    with pytest.raises(ValueError, match="voice"):
        tw.generate(out, n_train=1, n_val=0, n_test=0, views=("speech",), voice="robot")


# ---------------------------------------------------------------------------------------------
# espeak-ng: a stand-in on the PATH checks the cutting; the real one when it is installed

_FAKE_ESPEAK = """#!{python}
import io, re, sys
import numpy as np, soundfile as sf
ssml = sys.stdin.read()
words = re.findall(r"([^<>\\s]+)<break", ssml) or [ssml.strip()]
rate = 22050
silence = np.zeros(int(0.6 * rate))
parts = [silence[:2000]]
for i, w in enumerate(words):
    t = np.arange(int(0.1 * rate * (1 + len(w) % 3))) / rate
    parts += [0.3 * np.sin(2 * np.pi * (200 + 50 * i) * t), silence]
buf = io.BytesIO()
sf.write(buf, np.concatenate(parts), rate, format="WAV", subtype="PCM_16")
sys.stdout.buffer.write(buf.getvalue())
"""


def test_espeak_voice_cuts_words_at_its_breaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = tmp_path / "espeak-ng"
    exe.write_text(_FAKE_ESPEAK.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert tw.espeak_available()
    text = "Un grand carré, qui est au-dessus d'une étoile."
    got = tw.speak(text, "fr", voice="espeak")
    assert [w for w, _, _ in got.words] == _tokens(text)
    for word, a, b in got.words:  # the stand-in says each word for 0.1-0.3 s
        assert abs((b - a) - 0.1 * (1 + len(word) % 3)) < 0.005, (word, a, b)
    _check_timing(got.wave.astype(np.float64), [list(w) for w in got.words], "espeak")


@pytest.mark.skipif(not tw.espeak_available(), reason="espeak-ng is not installed")
def test_real_espeak_speaks_every_language() -> None:
    scene = tw.sample_scene(0, "val", 0)
    for lang in tw.LANGUAGES:
        text = tw.describe(scene, lang)
        got = tw.speak(text, lang, scene.entropy, voice="espeak")
        assert [w for w, _, _ in got.words] == _tokens(text)
        edges = [0.0, *(t for _, a, b in got.words for t in (a, b))]
        gaps = [got.wave[int(a * RATE) : int(b * RATE)] for a, b in zip(edges[::2], edges[1::2])]
        assert max(_rms(g) for g in gaps) < 1e-3
