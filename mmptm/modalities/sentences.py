"""The sentences a sample holds: its segments by sample format, and every sentence in it.

Shared by the text plug-in (``text.py``, which tokenises the segments) and the tokenizer
trainer (which reads every sentence of the shards it trains on). No torch here: training a
tokenizer from text files imports none.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mmptm.modalities.base import Sample


@dataclass(frozen=True)
class Segment:
    """One sentence of a sample, its language and where in the ``json`` it came from."""

    text: str
    lang: str
    #: the json path of the text: ("captions", lang), ("texts", i), ("premise",), ("txt",) ...
    where: tuple[str | int, ...] = ("txt",)


def segments(
    sample: Sample,
    meta: Mapping[str, Any],
    caption_languages: Sequence[str],
    rng: random.Random | None,
    captions_field: str = "captions",
    caption_index: int = 0,
) -> list[Segment]:
    """The segments of a sample, by its format (see the module docstring).

    With ``rng`` (training) a caption language is drawn per sample, one of a language's
    captions when it has several (``{lang: [c1, c2, ...]}``: MSR-VTT's 20 per clip), and a
    pair comes in a random order (both directions, as XLM's TLM); without, the first caption
    language, its caption number ``caption_index`` (0 = the first; a language with a single
    caption has only 0) and the stored order are used. ``captions_field`` reads
    captions from another json field of the same shape (toyworld video's
    ``reversed_captions``); only the default field falls back to the ``txt`` member.
    """
    if "question" in meta:
        return [Segment(meta["question"], meta.get("language", "en"), ("question",))]
    if "premise" in meta and "hypothesis" in meta:
        lang = meta.get("language", "")
        return [
            Segment(meta["premise"], lang, ("premise",)),
            Segment(meta["hypothesis"], lang, ("hypothesis",)),
        ]
    if "texts" in meta:
        texts, langs = meta["texts"], meta.get("languages") or ["", ""]
        if len(texts) != 2 or len(langs) != 2:
            raise ValueError(f"a parallel pair needs 2 texts and 2 languages, got {len(texts)}")
        pair = [Segment(t, lang, ("texts", i)) for i, (t, lang) in enumerate(zip(texts, langs))]
        if rng is not None and rng.random() < 0.5:
            pair.reverse()
        return pair
    captions = meta.get(captions_field) or {}
    if not isinstance(captions, dict):
        raise ValueError(f"json {captions_field!r} must map languages to captions")
    langs = [lang for lang in caption_languages if captions.get(lang)]
    if langs:
        lang = rng.choice(langs) if rng is not None else langs[0]
        caption = captions[lang]
        if isinstance(caption, list):
            i = rng.randrange(len(caption)) if rng is not None else caption_index
            if i >= len(caption):
                raise ValueError(f"{captions_field}[{lang!r}] has no caption {i} ({len(caption)})")
            return [
                Segment(_caption(caption[i], captions_field, lang), lang, (captions_field, lang, i))
            ]
        if rng is None and caption_index > 0:
            raise ValueError(f"{captions_field}[{lang!r}] has no caption {caption_index} (1)")
        return [Segment(_caption(caption, captions_field, lang), lang, (captions_field, lang))]
    if captions_field != "captions":
        raise ValueError(f"no {captions_field!r} in {list(caption_languages)}")
    if "txt" in sample:
        if rng is None and caption_index > 0:
            raise ValueError(f"the txt member is one caption; there is no caption {caption_index}")
        lang = meta.get("language") or (caption_languages[0] if caption_languages else "")
        return [Segment(sample["txt"].decode("utf-8"), lang, ("txt",))]
    raise ValueError(f"no text: no caption in {list(caption_languages)}, no pair, no txt member")


def every_segment(
    sample: Sample, meta: Mapping[str, Any], captions_field: str = "captions"
) -> list[Segment]:
    """Every sentence a sample gives as a text view, with its language ("" when unknown).

    What a search index stores of a sample: each caption in each language (every caption of a
    language with several), both sentences of a pair, NLI's premise and hypothesis, a
    question, or the ``txt`` member (:func:`segments` picks one of these per sample); none
    for a sample without text (an image collection without captions).
    """
    captions = meta.get(captions_field)
    other = any(k in meta for k in ("question", "premise", "texts"))
    if other or not captions:
        return segments(sample, meta, (), None, captions_field) if other or "txt" in sample else []
    if not isinstance(captions, dict):
        raise ValueError(f"json {captions_field!r} must map languages to captions")
    out = []
    for lang, caption in captions.items():
        if isinstance(caption, list):
            out += [
                Segment(_caption(c, captions_field, lang), lang, (captions_field, lang, i))
                for i, c in enumerate(caption)
            ]
        elif caption:
            out.append(
                Segment(_caption(caption, captions_field, lang), lang, (captions_field, lang))
            )
    return out


def _caption(value: Any, field: str, lang: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"json {field}[{lang!r}] holds a {type(value).__name__}, not a string")
    return value


def sample_texts(sample: Sample) -> Iterator[tuple[str, str]]:
    """Every sentence a raw sample holds, with its language ("" when unknown), member by member.

    What the tokenizer trains on: ``*txt`` members line by line, and in ``json`` every caption
    language, both texts of a pair, NLI premise and hypothesis, VQA questions. A member that
    is not valid UTF-8 / JSON raises ``ValueError``.
    """
    metas = {ext: json.loads(data.decode("utf-8")) for ext, data in _members(sample, "json")}
    lang = next((m["language"] for m in metas.values() if _is_lang(m)), "")
    for ext, data in _members(sample, "txt", "json"):
        if ext in metas:
            if isinstance(metas[ext], dict):
                yield from _json_texts(metas[ext])
        else:  # a txt member is in the language its sample's json names
            yield from ((line, lang) for line in _lines(data.decode("utf-8")))


def _members(sample: Sample, *kinds: str) -> Iterator[tuple[str, bytes]]:
    """(extension, bytes) of the members whose last extension is one of ``kinds``."""
    for ext, data in sample.items():
        if not ext.startswith("__") and ext.rsplit(".", 1)[-1].lower() in kinds:
            yield ext, data


def _is_lang(meta: Any) -> bool:
    return isinstance(meta, dict) and isinstance(meta.get("language"), str)


def _json_texts(meta: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    captions = meta.get("captions")
    if isinstance(captions, dict):
        for lang, caption in captions.items():
            for c in caption if isinstance(caption, list) else [caption]:
                if isinstance(c, str):
                    yield from ((line, lang) for line in _lines(c))
    texts, langs = meta.get("texts"), meta.get("languages")
    if isinstance(texts, list):
        langs = langs if isinstance(langs, list) and len(langs) == len(texts) else [""] * 2
        for t, lang in zip(texts, langs):
            if isinstance(t, str):
                yield from ((line, str(lang)) for line in _lines(t))
    lang = meta.get("language") if isinstance(meta.get("language"), str) else ""
    for key in ("premise", "hypothesis", "question"):
        if isinstance(meta.get(key), str):
            yield from ((line, lang) for line in _lines(meta[key]))


def _lines(text: str) -> Iterator[str]:
    for line in text.splitlines():
        line = line.strip()
        if line:
            yield line
