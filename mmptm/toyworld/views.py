"""The views: each turns the scenes of one split into samples, through a ViewOutput.

:data:`VIEWS` maps a view's name to its writer; :func:`mmptm.toyworld.generate` runs
every writer for every split. :data:`VIDEO_VIEWS` (clips of :mod:`.motion`) and
:data:`AUDIO_VIEWS` (sounds and speech of :mod:`.sound`) are written only when asked for:
encoding thousands of clips takes a while, and speech takes room (about 14 KiB a second).
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from mmptm.converters.text import XNLI_COLUMNS, convert_xnli
from mmptm.data.shards import ShardWriter
from mmptm.modalities.audio_io import encode_audio
from mmptm.toyworld.detector import _detections, frame_features, one_thread
from mmptm.toyworld.language import (
    captions,
    describe,
    granular_captions,
    nli_pairs,
    nli_text,
    statements,
)
from mmptm.toyworld.motion import (
    CLIP_FPS,
    Clip,
    clip_record,
    render_clip,
    scene_clip,
    video_qa_record,
    video_questions,
)
from mmptm.toyworld.scene import COLORS, SHAPES, Scene, _jpegs, location, object_box, relations
from mmptm.toyworld.sound import (
    COUNT_LABELS,
    LOUDNESS,
    NOTE_SECONDS,
    ONSET_SPAN,
    PITCHES,
    SAMPLE_RATE,
    SCENE_SECONDS,
    SPEAKERS,
    TIMBRES,
    Speech,
    scene_sound,
    sound_labels,
    speak,
)
from mmptm.toyworld.vqa import _vqa_files, _vqa_record, vqa_file_names, vqa_questions


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


@dataclass(frozen=True)
class ViewSettings:
    """What every view needs besides the scenes."""

    languages: tuple[str, ...]
    image_size: int
    views: tuple[str, ...] = ()  # the views being written (empty: unknown, compute everything)
    voice: str = "builtin"  # the speech view's synthesiser (see sound.speak)
    seed: int = 0  # the data seed, for views that draw beyond the scenes (knowledge)
    shared_looks: int = 1  # knowledge: toys per look (1: each toy its own)


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
    """img2dataset-style samples: ``jpg``, ``txt`` (primary caption), ``json`` (annotations,
    every caption language, and the finer captions ``object_captions``, ``pair_captions``
    and ``list_captions`` of :func:`granular_captions`)."""
    primary = _primary(cfg)
    jpgs = _jpegs(tuple(scenes), cfg.image_size)
    records = _records(tuple(scenes), cfg.image_size, cfg.languages)
    with out.writer() as writer:
        for scene, jpg, record in zip(scenes, jpgs, records):
            txt = record["captions"][primary]
            # this view's json alone: regions and audio share the record and keep their bytes
            meta = {**record, **granular_captions(scene, cfg.languages)}
            writer.write({"__key__": scene.key, "jpg": jpg, "txt": txt, "json": meta})


def _texts(scene: Scene, lang: str, split: str) -> list[tuple[str, str]]:
    """(key suffix, text) of a scene in one language for the text corpora.

    Every split has the caption; train adds the scene's :func:`statements`, sentences of the
    kind NLI hypotheses are (definite noun phrases, predicative sizes), so that pre-training
    text covers the fine-tuning vocabulary as a web corpus would. Val and test keep captions
    only: they are the held-out retrieval and probe sets.
    """
    texts = [("", describe(scene, lang))]
    if split == "train":
        texts.append(("_statements", statements(scene, lang)))
    return texts


def write_parallel(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """One sample per scene, language pair and text of :func:`_texts` (the translations)."""
    pairs = list(itertools.combinations(cfg.languages, 2))
    with out.writer() as writer:
        for scene in scenes:
            texts = {lang: _texts(scene, lang, out.split) for lang in cfg.languages}
            for a, b in pairs:
                for (suffix, text_a), (_, text_b) in zip(texts[a], texts[b]):
                    writer.write(
                        {
                            "__key__": f"{scene.key}_{a}_{b}{suffix}",
                            "json": {
                                "scene": scene.key,
                                "languages": [a, b],
                                "texts": [text_a, text_b],
                            },
                        }
                    )


def write_mono(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """Monolingual text, one shard set per language (so sources can be sampled by size)."""
    for lang in cfg.languages:
        with out.writer(lang) as writer:
            for scene in scenes:
                meta = {"language": lang}
                for suffix, text in _texts(scene, lang, out.split):
                    writer.write(
                        {"__key__": f"{scene.key}_{lang}{suffix}", "txt": text, "json": meta}
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
    """The ``image_text`` samples (same keys and bytes, but the json has no finer captions)
    plus ``regions.npz`` (see detect)."""
    primary = _primary(cfg)
    media = _detections(tuple(scenes), cfg.image_size)
    records = _records(tuple(scenes), cfg.image_size, cfg.languages)
    with out.writer() as writer:
        for scene, (jpg, npz), record in zip(scenes, media, records):
            txt = record["captions"][primary]
            sample = {"__key__": scene.key, "jpg": jpg, "txt": txt, "json": record}
            writer.write({**sample, "regions.npz": npz})


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
# Video

# One thread: for 8 small frames faster than a pool. Without macroblock-tree rate control:
# with it, x264 (core 165) gave different bytes for the same 64 px frames now and then.
_X264_OPTIONS = {"threads": "1", "preset": "veryfast", "x264-params": "mbtree=0"}


@dataclass(frozen=True)
class _ClipMedia:
    clip: Clip
    record: dict[str, Any]
    mp4: bytes | None
    npy: bytes | None


@lru_cache(maxsize=1)
def _clip_media(
    scenes: tuple[Scene, ...],
    image_size: int,
    languages: tuple[str, ...],
    mp4: bool,
    features: bool,
) -> tuple[_ClipMedia, ...]:
    """Each scene's clip, its json record, mp4 and features; shared by the video views.

    Frames are rendered once and dropped after encoding: a split's frames would not fit in
    memory comfortably. Features are taken from the rendered frames, not the lossy mp4.
    """
    with one_thread():
        return tuple(_one_clip(s, image_size, languages, mp4, features) for s in scenes)


def _one_clip(
    scene: Scene, image_size: int, languages: tuple[str, ...], mp4: bool, features: bool
) -> _ClipMedia:
    from mmptm.modalities.video import encode_video

    clip = scene_clip(scene)
    frames = render_clip(clip, image_size)
    npy = None
    if features:
        buf = io.BytesIO()
        np.save(buf, frame_features(frames))
        npy = buf.getvalue()
    video = encode_video(frames, CLIP_FPS, "mp4", options=_X264_OPTIONS) if mp4 else None
    return _ClipMedia(clip, clip_record(clip, image_size, languages), video, npy)


def _media(scenes: Sequence[Scene], cfg: ViewSettings) -> tuple[_ClipMedia, ...]:
    views = set(cfg.views) or set(VIDEO_VIEWS)
    mp4 = bool(views & {"video", "video_qa"})
    features = bool(views & {"video_features", "video_qa"})
    return _clip_media(tuple(scenes), cfg.image_size, cfg.languages, mp4, features)


def write_video(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """video2dataset-style clips: ``mp4``, ``txt`` (primary caption), ``json`` (clip_record)."""
    primary = _primary(cfg)
    with out.writer() as writer:
        for m in _media(scenes, cfg):
            txt = m.record["captions"][primary]
            writer.write({"__key__": m.clip.key, "mp4": m.mp4, "txt": txt, "json": m.record})


def write_video_features(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """Pre-extracted features: ``npy`` [T, F] (see frame_features), ``txt``, ``json``."""
    primary = _primary(cfg)
    with out.writer() as writer:
        for m in _media(scenes, cfg):
            txt = m.record["captions"][primary]
            writer.write({"__key__": m.clip.key, "npy": m.npy, "txt": txt, "json": m.record})


def write_video_qa(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """Video QA in the VQA layout: ``mp4`` (the video view's clip), ``npy`` (its features, for
    the feature recipes) + ``json``, key = question id."""
    with out.writer() as writer:
        for m in _media(scenes, cfg):
            for q in video_questions(m.clip):
                record = video_qa_record(m.clip, q)
                sample = {"__key__": str(q.question_id), "mp4": m.mp4, "npy": m.npy}
                writer.write({**sample, "json": record})


VIDEO_VIEWS: dict[str, Callable[[Sequence[Scene], ViewOutput, ViewSettings], None]] = {
    "video": write_video,
    "video_features": write_video_features,
    "video_qa": write_video_qa,
}


# ---------------------------------------------------------------------------------------------
# Audio

_CHUNK = 64  # samples synthesised at a time: memory stays bounded, a pool stays busy


def _chunked_map(fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterator[Any]:
    """``fn`` over ``items`` in order, on a thread per CPU (numpy's FFTs and ufuncs and the
    FLAC encoder release the GIL) when there are enough of them; results are pure functions
    of their item, so the bytes do not depend on the threads."""
    workers = min(os.cpu_count() or 1, 8)
    if workers == 1 or len(items) < 2 * _CHUNK:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(workers) as pool:
        for i in range(0, len(items), _CHUNK):
            yield from pool.map(fn, items[i : i + _CHUNK])


def _scene_flac(scene: Scene) -> bytes:
    return encode_audio(scene_sound(scene), SAMPLE_RATE)


def audio_record(scene: Scene, image_size: int, languages: Sequence[str]) -> dict[str, Any]:
    """The ``json`` member of an audio sample: :func:`scene_record` plus the sound's labels."""
    return {
        **scene_record(scene, image_size, languages),
        **sound_labels(scene),
        "sample_rate": SAMPLE_RATE,
        "seconds": SCENE_SECONDS,
    }


def write_audio(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """Scene sounds: ``flac`` (see sound.scene_sound), ``jpg`` (the image_text image), ``txt``
    (primary caption), ``json`` (:func:`audio_record`: captions, objects, labels)."""
    primary = _primary(cfg)
    jpgs = _jpegs(tuple(scenes), cfg.image_size)
    flacs = _chunked_map(_scene_flac, scenes)
    with out.writer() as writer:
        for scene, jpg, flac in zip(scenes, jpgs, flacs):
            record = audio_record(scene, cfg.image_size, cfg.languages)
            txt = record["captions"][primary]
            sample = {"__key__": scene.key, "flac": flac, "jpg": jpg, "txt": txt}
            writer.write({**sample, "json": record})


def speech_record(
    scene: Scene, lang: str, caption: str, speech: Speech, voice: str
) -> dict[str, Any]:
    """The ``json`` member of a speech sample: its key, scene, language, caption, and words
    as [word, start_s, end_s] (silence between them)."""
    return {
        "key": f"{scene.key}_{lang}",
        "scene": scene.key,
        "split": scene.split,
        "language": lang,
        "caption": caption,
        "words": [[w, start, end] for w, start, end in speech.words],
        "sample_rate": speech.rate,
        "seconds": len(speech.wave) / speech.rate,
        "voice": voice,
    }


@dataclass(frozen=True)
class _SpeechJob:
    lang: str
    voice: str

    def __call__(self, scene: Scene) -> tuple[str, bytes, dict[str, Any]]:
        caption = describe(scene, self.lang)
        speech = speak(caption, self.lang, scene.entropy, self.voice)
        record = speech_record(scene, self.lang, caption, speech, self.voice)
        return caption, encode_audio(speech.wave, speech.rate), record


def write_speech(scenes: Sequence[Scene], out: ViewOutput, cfg: ViewSettings) -> None:
    """Spoken captions, one shard set per language: ``flac`` (the caption spoken, see
    sound.speak), ``txt`` (the written caption), ``jpg`` (the scene), ``json`` (language,
    caption, words with their start and end in seconds)."""
    jpgs = _jpegs(tuple(scenes), cfg.image_size)
    for lang in cfg.languages:
        spoken = _chunked_map(_SpeechJob(lang, cfg.voice), scenes)
        with out.writer(lang) as writer:
            for jpg, (caption, flac, record) in zip(jpgs, spoken):
                sample = {"__key__": record["key"], "flac": flac, "txt": caption, "jpg": jpg}
                writer.write({**sample, "json": record})


AUDIO_VIEWS: dict[str, Callable[[Sequence[Scene], ViewOutput, ViewSettings], None]] = {
    "audio": write_audio,
    "speech": write_speech,
}


def audio_manifest(voice: str | None) -> dict[str, Any]:
    """The manifest's ``audio`` section: the constants of sound.py (``voice``: when speech
    was written by this run)."""
    section = {
        "sample_rate": SAMPLE_RATE,
        "scene_seconds": SCENE_SECONDS,
        "note_seconds": NOTE_SECONDS,
        "onset": f"{ONSET_SPAN} * x seconds",
        "pitches": dict(PITCHES),
        "timbres": dict(TIMBRES),
        "loudness_rms": dict(LOUDNESS),
        "label": {"of": "count", "names": list(COUNT_LABELS)},
        "speaker_pitch": dict(SPEAKERS),
    }
    return section if voice is None else {**section, "voice": voice}


def drop_stale(folder: Path, split: str, written: set[Path]) -> None:
    """Delete the shards of ``split`` in ``folder`` that this run did not write: a previous,
    larger run may have left more shards (or other languages), and globbing readers would mix
    them in."""
    ours = re.compile(rf"{split}(-[A-Za-z0-9_-]+)?-[0-9]{{6}}\.tar")
    for old in folder.glob(f"{split}-*.tar"):
        if ours.fullmatch(old.name) and old not in written:
            old.unlink()


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
