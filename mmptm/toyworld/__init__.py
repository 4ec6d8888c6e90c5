"""toyworld: the embedded default data set, generated from a seed instead of downloaded.

A *scene* is a handful of coloured shapes on a light background. The pipeline is kept in
separate stages so later views (VQA, detector features, video, sound, knowledge graph) can be
added without touching the others::

    sample_scene (layout) -> render (pixels) -> describe (captions) -> VIEWS (shard writers)

Views, each written for every split and requested language:

- ``image_text``: img2dataset-style ``jpg`` + ``txt`` + ``json`` (annotations, all captions:
  the scene's in ``captions``, and finer ones, one per object in ``object_captions`` ("a
  large red circle"), one per neighbouring pair and direction in ``pair_captions``, every
  object listed in ``list_captions``, see :func:`granular_captions`)
- ``parallel``: one sample per scene and language pair, ``json`` = {languages, texts}; the
  train split adds a second one per pair with the scene's :func:`statements` (true claims in
  the words of NLI hypotheses: "The red circle is large.")
- ``mono``: monolingual text, one shard set per language: ``mono/{split}-{lang}-%06d.tar``,
  captions and (train) statements
- ``nli``: premise (caption of the first k objects) / hypothesis (one claim about an object)
  pairs labelled entailment, neutral or contradiction, translations sharing a pair id.
  Written as the real corpora ship (XNLI 1.0 TSV; MultiNLI and XNLI-MT translate-train
  TSVs for train), then converted to ``nli/{split}-{lang}-%06d.tar`` by
  :func:`mmptm.converters.text.convert_xnli`.
- ``regions``: the ``image_text`` samples (same keys and members) plus ``regions.npz``, what
  a bottom-up-attention detector would give: one region per object (no whole-image region),
  its box, a frozen random CNN's RoI feature, a noisy class distribution over SHAPES and the
  true shape id (see :func:`detect`).
- ``vqa``: 2-3 questions per scene with ten annotators' answers, written as VQA v2 ships
  (``v2_OpenEnded_toyworld_{split}_questions.json`` + ``v2_toyworld_{split}_annotations.json``)
  and as ``vqa/{split}-%06d.tar`` samples (``jpg``, ``regions.npz``, ``json``): what
  :func:`mmptm.converters.vl.convert_vqa` makes of those files, the images and the
  regions as a BUTD TSV (tested; the TSV drops only ``probs``). Written directly, which
  spares putting every image on disk just to read it back.

Video views, written only when asked for (``generate(views=...)``; see
:mod:`~mmptm.toyworld.motion`): each scene becomes an 8-frame clip (8 fps) in which one
or two of its shapes move, grow or shrink, appear or disappear, one after the other.

- ``video``: video2dataset-style ``mp4`` + ``txt`` + ``json`` (captions, ``reversed_captions``
  = the clip played backwards, the events, per-frame boxes)
- ``video_features``: the same samples with ``npy`` [8, 256] float16 per-frame features
  (:func:`frame_features`: the detector's CNN over the whole frame, pooled over a 4x4 grid,
  randomly projected) instead of ``mp4``
- ``video_qa``: 2-3 English questions per clip in the VQA layout (``mp4`` + ``json``)

Audio views, also opt-in (see :mod:`~mmptm.toyworld.sound`): every scene sounds (colour
→ pitch, shape → timbre, size → loudness, x → onset) and every caption is spoken by a
built-in formant synthesiser (no system package), 16 kHz mono FLAC.

- ``audio``: per scene ``flac`` (1 s), ``jpg`` (the image_text image), ``txt`` and ``json``
  (:func:`audio_record`: the image_text record plus ``count``, ``loudest_color`` and
  ``label`` = the count as a name of :data:`COUNT_LABELS`)
- ``speech``: one sample per scene and language, one shard set per language
  (``speech/{split}-{lang}-%06d.tar``): ``flac`` (the spoken caption), ``txt`` (the written
  one), ``jpg``, ``json`` (``language``, ``caption``, ``words``: [[word, start_s, end_s]])

The knowledge view, opt-in too (see :mod:`~mmptm.toyworld.knowledge`): every appearance
is a named toy with facts (made of, owned by, comes from) in a graph, the facts of half of
them also stated in a text corpus.

- ``knowledge``: ``knowledge/graph/`` (FB15k-237 layout, aliases, descriptions, toys.json),
  ``knowledge/text/{split}-{lang}-%06d.tar`` (sentences with ``json.mentions``),
  ``knowledge/image_text/{split}-%06d.tar`` (the scenes, captions naming the toys,
  ``regions.npz``, ``json.region_entities``) and the downstream sets (cloze probe, entity
  typing, relation classification, knowledge VQA; :mod:`~mmptm.toyworld.knowledge_sets`)

Every scene draws from ``numpy.random.default_rng([seed, split_code, index])``, so a scene
depends only on its own coordinates: growing ``n_train`` leaves val/test unchanged, and the

Modules, in pipeline order:

- :mod:`~mmptm.toyworld.scene`: labels and constants, :class:`Obj`, :class:`Scene`,
  :func:`sample_scene`, relations, locations, boxes, :func:`render`, :func:`encode_jpeg`
- :mod:`~mmptm.toyworld.language`: :data:`LEXICON`, the grammar behind
  :func:`describe` / :func:`captions`, the finer captions (:func:`object_phrase`,
  :func:`pair_caption`, :func:`object_list`, :func:`granular_captions`), NLI pairs and
  their text (:func:`nli_pairs`, :func:`state`, :func:`nli_text`), the statements of the
  text corpora (:func:`facts`, :func:`statements`)
- :mod:`~mmptm.toyworld.detector`: the frozen seeded CNN behind ``regions.npz``
  (:func:`roi_features`, :func:`detect`)
- :mod:`~mmptm.toyworld.vqa`: VQA questions and annotators' answers
  (:func:`vqa_questions`), the VQA v2 files' names and contents
- :mod:`~mmptm.toyworld.motion`: clips (:class:`Clip`, :class:`Event`,
  :func:`sample_clip`, :func:`reverse_clip`, :func:`render_clip`), their captions
  (:func:`narrate`) and questions (:func:`video_questions`)
- :mod:`~mmptm.toyworld.sound`: scene sounds (:func:`scene_sound`,
  :func:`sound_labels`) and speech (:func:`speak`, :class:`Speech`)
- :mod:`~mmptm.toyworld.knowledge` and :mod:`~mmptm.toyworld.knowledge_sets`: the
  toys (:func:`build_world`), their graph and text, the downstream sets, :data:`KNOWLEDGE_VIEWS`
- :mod:`~mmptm.toyworld.views`: :data:`VIEWS`, :data:`VIDEO_VIEWS` and
  :data:`AUDIO_VIEWS`, the shard writers, :class:`ViewSettings`
- this package: :func:`generate` and the manifest; every name above is re-exported here
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mmptm.progress import progress_bar
from mmptm.toyworld.detector import (
    _ROI_SIZE,
    DETECTOR_FEATURES,
    DETECTOR_SEED,
    FRAME_FEATURES,
    detect,
    frame_features,
    one_thread,
    roi_features,
)
from mmptm.toyworld.knowledge import SHARED_LOOKS, build_world, knowledge_manifest
from mmptm.toyworld.knowledge_sets import KNOWLEDGE_VIEWS
from mmptm.toyworld.language import (
    CAPTION_FIELDS,
    LANGUAGES,
    LEXICON,
    MAX_STATEMENTS,
    NLI_LABELS,
    OPPOSITE,
    Claim,
    NliPair,
    captions,
    describe,
    facts,
    granular_captions,
    lexicon_forms,
    nli_pairs,
    nli_text,
    object_list,
    object_phrase,
    pair_caption,
    state,
    statements,
)
from mmptm.toyworld.motion import (
    CLIP_FPS,
    CLIP_FRAMES,
    EVENT_KINDS,
    MOTION_LEXICON,
    REVERSE,
    Clip,
    Event,
    clip_captions,
    clip_record,
    narrate,
    object_states,
    render_clip,
    reverse_clip,
    sample_clip,
    scene_clip,
    video_qa_record,
    video_questions,
)
from mmptm.toyworld.scene import BACKGROUND as BACKGROUND
from mmptm.toyworld.scene import (
    COLORS,
    GENERATOR_VERSION,
    LOCATIONS,
    RELATIONS,
    SHAPES,
    SIZES,
    SPLITS,
    Obj,
    Scene,
    encode_jpeg,
    location,
    object_box,
    relation,
    relations,
    render,
    sample_scene,
)
from mmptm.toyworld.scene import DOMINANCE as DOMINANCE
from mmptm.toyworld.scene import EDGE as EDGE
from mmptm.toyworld.scene import GAP as GAP
from mmptm.toyworld.scene import GRID_MARGIN as GRID_MARGIN
from mmptm.toyworld.scene import JPEG_QUALITY as JPEG_QUALITY
from mmptm.toyworld.scene import N_OBJECTS_P as N_OBJECTS_P
from mmptm.toyworld.scene import NOISE as NOISE
from mmptm.toyworld.scene import SUPERSAMPLE as SUPERSAMPLE
from mmptm.toyworld.sound import (
    COUNT_LABELS,
    PITCHES,
    SPEAKERS,
    TIMBRES,
    VOICES,
    Speech,
    espeak_available,
    scene_sound,
    sound_labels,
    speak,
)
from mmptm.toyworld.views import (
    AUDIO_VIEWS,
    VIDEO_VIEWS,
    VIEWS,
    ViewOutput,
    ViewSettings,
    _write_atomic,
    audio_manifest,
    audio_record,
    drop_stale,
    scene_record,
    speech_record,
)
from mmptm.toyworld.views import write_image_text as write_image_text
from mmptm.toyworld.views import write_mono as write_mono
from mmptm.toyworld.views import write_nli as write_nli
from mmptm.toyworld.views import write_parallel as write_parallel
from mmptm.toyworld.views import write_regions as write_regions
from mmptm.toyworld.views import write_vqa as write_vqa
from mmptm.toyworld.vqa import ANSWER_TYPES, VqaQuestion, vqa_file_names, vqa_questions

# The ``X as X`` imports above re-export names outside __all__ that were importable from here
# before the split (the tests use some).
__all__ = [
    "ALL_VIEWS",
    "ANSWER_TYPES",
    "AUDIO_VIEWS",
    "CAPTION_FIELDS",
    "CLIP_FPS",
    "CLIP_FRAMES",
    "COLORS",
    "COUNT_LABELS",
    "DETECTOR_FEATURES",
    "DETECTOR_SEED",
    "EVENT_KINDS",
    "FRAME_FEATURES",
    "GENERATOR_VERSION",
    "KNOWLEDGE_VIEWS",
    "LANGUAGES",
    "LEXICON",
    "LOCATIONS",
    "MAX_STATEMENTS",
    "MOTION_LEXICON",
    "NLI_LABELS",
    "OPPOSITE",
    "PITCHES",
    "RELATIONS",
    "REVERSE",
    "SHAPES",
    "SIZES",
    "SPEAKERS",
    "SPLITS",
    "TIMBRES",
    "VIDEO_VIEWS",
    "VIEWS",
    "VOICES",
    "Claim",
    "Clip",
    "Event",
    "NliPair",
    "Obj",
    "Scene",
    "Speech",
    "ViewOutput",
    "ViewSettings",
    "VqaQuestion",
    "audio_manifest",
    "audio_record",
    "build_world",
    "captions",
    "clip_captions",
    "clip_record",
    "describe",
    "detect",
    "encode_jpeg",
    "espeak_available",
    "facts",
    "frame_features",
    "generate",
    "granular_captions",
    "lexicon_forms",
    "location",
    "narrate",
    "nli_pairs",
    "nli_text",
    "object_box",
    "object_list",
    "object_phrase",
    "object_states",
    "one_thread",
    "pair_caption",
    "relation",
    "relations",
    "render",
    "render_clip",
    "reverse_clip",
    "roi_features",
    "sample_clip",
    "sample_scene",
    "scene_clip",
    "scene_record",
    "scene_sound",
    "sound_labels",
    "speak",
    "speech_record",
    "state",
    "statements",
    "video_qa_record",
    "video_questions",
    "vqa_file_names",
    "vqa_questions",
]

log = logging.getLogger(__name__)
#: every view generate() can write; by default it writes VIEWS
ALL_VIEWS = {**VIEWS, **VIDEO_VIEWS, **AUDIO_VIEWS, **KNOWLEDGE_VIEWS}
#: the manifest's per-kind sections: name -> the views that bring it
_SECTIONS = {"video": VIDEO_VIEWS, "knowledge": KNOWLEDGE_VIEWS, "audio": AUDIO_VIEWS}
# manifest fields that must match for an earlier run's views to be kept beside this run's
_SAME_DATA = ("generator", "version", "seed", "languages", "image_size", "shard_size", "counts")


def _check_args(
    counts: dict[str, int],
    languages: Sequence[str],
    image_size: int,
    shard_size: int,
    views: Sequence[str],
    voice: str = "builtin",
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
    unknown = [v for v in views if v not in ALL_VIEWS]
    if unknown or not views:
        raise ValueError(f"unknown or no view(s) {unknown}; choices: {', '.join(ALL_VIEWS)}")
    if len(set(views)) != len(views):
        raise ValueError(f"views repeat: {list(views)}")
    if set(views) & set(VIDEO_VIEWS) and image_size % 16:
        # 4:2:0 video needs even sides; frame_features' 4x4 grid of a quarter-size map, 16
        raise ValueError(f"video views need image_size a multiple of 16, got {image_size}")
    if voice not in VOICES:
        raise ValueError(f"unknown voice {voice!r}; choices: {', '.join(VOICES)}")
    if voice == "espeak" and "speech" in views and not espeak_available():
        raise ValueError("voice 'espeak' needs espeak-ng on the PATH (apt install espeak-ng)")


def _earlier_views(path: Path, manifest: dict[str, Any], views: Sequence[str]) -> dict:
    """The manifest entries of views an earlier run wrote into the same data set.

    Kept only if that run used the same settings (seed, counts, ...): else its files describe
    another data set, and are left out with a warning.
    """
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    if not isinstance(old, dict) or not isinstance(old.get("shards"), dict):
        return {}
    others = [v for v in old["shards"] if v in ALL_VIEWS and v not in views]
    if not others:
        return {}
    if any(old.get(k) != manifest[k] for k in _SAME_DATA):
        log.warning("%s: dropping views %s of an earlier run with other settings", path, others)
        return {}
    kept = {
        field: {v: old[field][v] for v in others if v in old.get(field, {})}
        for field in ("shards", "samples", "by_language")
    }
    # the sections that describe those views (a knowledge view's shared_looks, speech's voice)
    kept["sections"] = {k: old[k] for k in _SECTIONS if isinstance(old.get(k), dict)}
    return kept


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
    views: Sequence[str] | None = None,
    voice: str = "builtin",
    progress: bool = False,
    shared_looks: int = 1,
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

    ``views``: which to write, from :data:`ALL_VIEWS` (default: :data:`VIEWS`; the video
    views ``video``, ``video_features`` and ``video_qa``, each ``{view}/{split}-%06d.tar``,
    are opt-in and add a ``video`` section to the manifest; so are the audio views ``audio``,
    ``{view}/{split}-%06d.tar``, and ``speech``, ``{view}/{split}-{lang}-%06d.tar``, which add
    an ``audio`` section). Views an earlier run wrote into ``out_dir`` with the same settings
    stay in the manifest, with the sections that describe them (``shared_looks``, ``voice``).

    ``voice``: the speech view's synthesiser, ``builtin`` or ``espeak`` (``espeak-ng``).
    ``progress``: a bar (or log lines, off a terminal) counting the views written per split.
    ``shared_looks``: the knowledge view's toys per look (1: each toy its own; see
    :mod:`~mmptm.toyworld.knowledge`).
    """
    counts = {"train": n_train, "val": n_val, "test": n_test}
    languages = tuple(languages)
    views = tuple(VIEWS) if views is None else tuple(views)
    _check_args(counts, languages, image_size, shard_size, views, voice)
    out = Path(out_dir)
    if shared_looks not in SHARED_LOOKS:
        raise ValueError(f"shared_looks must be one of {SHARED_LOOKS}, got {shared_looks}")
    cfg = ViewSettings(languages=languages, image_size=image_size, views=views, voice=voice,
                       seed=seed, shared_looks=shared_looks)  # fmt: skip
    shards: dict[str, dict[str, list[str]]] = {view: {} for view in views}
    samples: dict[str, dict[str, int]] = {view: {} for view in views}
    by_language: dict[str, dict[str, dict[str, Any]]] = {}
    with progress_bar(total=len(counts) * len(views), desc="toyworld", unit="view",
                      enabled=progress) as bar:  # fmt: skip
        for split, n in counts.items():
            scenes = [sample_scene(seed, split, i) for i in range(n)]
            for view in views:
                bar.set_postfix(view=f"{split} {view}")
                entry = _write_view(out, view, split, scenes, cfg, shard_size)
                shards[view][split], samples[view][split], per_language = entry
                if per_language is not None:
                    by_language.setdefault(view, {})[split] = per_language
                bar.update(1)
            if split == "train":
                _write_text(out, scenes, languages)
    manifest = _manifest(
        seed, languages, image_size, shard_size, counts,
        samples=samples, shards=shards, by_language=by_language,
    )  # fmt: skip
    earlier_sections = _add_earlier_views(out, manifest, views)
    _add_sections(manifest, views, earlier_sections, seed, voice, shared_looks)
    _write_atomic(out / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


def _write_view(
    out: Path, view: str, split: str, scenes: list[Scene], cfg: ViewSettings, shard_size: int
) -> tuple[list[str], int, dict[str, dict[str, Any]] | None]:
    """Write one view of one split, and drop the shards of it that an earlier run left.

    Returns the view's manifest entries for the split: its shards (relative to ``out``), its
    sample count, and the same per language when the view writes one shard set a language
    (None otherwise).
    """
    view_out = ViewOutput(out / view, split, shard_size)
    ALL_VIEWS[view](scenes, view_out, cfg)
    written = {Path(p) for paths in view_out.shards.values() for p in paths}
    drop_stale(out / view, split, written)

    def rel(paths: list[str]) -> list[str]:
        return [Path(p).relative_to(out).as_posix() for p in paths]

    shards = [p for paths in view_out.shards.values() for p in rel(paths)]
    samples = sum(view_out.samples.values())
    if not set(view_out.shards) <= set(cfg.languages):
        return shards, samples, None
    per_language = {
        lang: {"shards": rel(view_out.shards[lang]), "samples": view_out.samples[lang]}
        for lang in view_out.shards
    }
    return shards, samples, per_language


def _write_text(out: Path, scenes: list[Scene], languages: Sequence[str]) -> None:
    """``text/{lang}.txt``: the train scenes' captions, one a line (tokenizer training)."""
    for lang in languages:
        lines = "".join(describe(s, lang) + "\n" for s in scenes)
        _write_atomic(out / "text" / f"{lang}.txt", lines)


def _manifest(
    seed: int,
    languages: Sequence[str],
    image_size: int,
    shard_size: int,
    counts: dict[str, int],
    *,
    samples: dict[str, dict[str, int]],
    shards: dict[str, dict[str, list[str]]],
    by_language: dict[str, dict[str, dict[str, Any]]],
) -> dict[str, Any]:
    """The manifest of this run's views: settings, what was written, file names, labels."""
    return {
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
        "caption_fields": dict(CAPTION_FIELDS),  # image_text's json field per granularity
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


def _add_earlier_views(
    out: Path, manifest: dict[str, Any], views: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Keep in ``manifest`` the views an earlier run wrote beside these (same settings),
    every per-view field in :data:`ALL_VIEWS` order; the earlier manifest's sections
    (:data:`_SECTIONS`), for the kinds of view only that run wrote."""
    earlier = _earlier_views(out / "manifest.json", manifest, views)
    for field in ("shards", "samples", "by_language"):
        merged = {**earlier.get(field, {}), **manifest[field]}
        manifest[field] = {v: merged[v] for v in ALL_VIEWS if v in merged}
    return earlier.get("sections", {})


def _add_sections(
    manifest: dict[str, Any],
    views: Sequence[str],
    earlier: Mapping[str, dict[str, Any]],
    seed: int,
    voice: str,
    shared_looks: int = 1,
) -> None:
    """The ``video``, ``knowledge`` and ``audio`` sections, for a data set holding views of
    that kind. A kind this run wrote (``views``) is described by this run's settings; a kind
    only an earlier run wrote keeps that run's section (``earlier``), so writing other views
    later does not lose its ``shared_looks`` or ``voice``."""
    fresh = {
        "video": lambda: {
            "frames": CLIP_FRAMES,
            "fps": CLIP_FPS,
            "container": "mp4",
            "event_kinds": list(EVENT_KINDS),
            "feature_dim": FRAME_FEATURES,
            "qa_languages": ["en"],
        },
        "knowledge": lambda: knowledge_manifest(seed, shared_looks),
        "audio": lambda: audio_manifest(speaker),
    }
    speaker = voice if "speech" in views else earlier.get("audio", {}).get("voice")
    for name, kind in _SECTIONS.items():
        if not set(manifest["shards"]) & set(kind):
            continue
        ours = bool(set(views) & set(kind))
        manifest[name] = earlier[name] if not ours and name in earlier else fresh[name]()
