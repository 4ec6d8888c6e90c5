"""Search indexes: a collection embedded by a trained dual encoder, and queries against it.

:func:`build_index` (``mmptm index RUN --shards PATTERN --out DIR [--add]``) streams the
shards through the run's modality plug-ins in batches (loader workers decode; bad samples
are skipped and counted) and stores, per side of the contrastive head (``sides.py``), one
vector per item on a non-text side (image, regions, video, audio ...) and one per sentence
on a text side (every caption language, both sentences of a pair) in FAISS, beside each
item's key, sentences, short json fields and a JPEG thumbnail (``store.py`` has the
layout). A text side is split into one part per language, so a search can stay within one.

:class:`SearchIndex` (``mmptm retrieve``, ``mmptm serve``) loads the index and its run
and answers text → items (any side; text → text across languages on a text-only model),
image → items, and "more like this" (an item's stored vector → its neighbours), optionally
re-ranking a text query's top k with the model's ITM head (ALBEF style).
Legend: N vectors, E embedding width, K candidates.
"""

from __future__ import annotations

import glob
import io
import json
import logging
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from PIL import Image, UnidentifiedImageError
from tqdm import tqdm

from mmptm.batch import KEY, RECORD
from mmptm.data.decode import Collate, Decoder
from mmptm.data.pipeline import StreamConfig, SubSource, single_pass
from mmptm.data.shards import ShardCheck, check_shard, expand_shards, read_sample
from mmptm.eval.retrieval import albef_rerank_score, objective_types
from mmptm.modalities.base import Sample
from mmptm.modalities.sentences import every_segment
from mmptm.registry import MODALITIES
from mmptm.search.images import MAX_IMAGE_PIXELS, PNG_MODES, shrink
from mmptm.search.sides import DualEncoder, Side, text_sample
from mmptm.search.store import (
    FORMAT,
    VERSION,
    DamagedIndex,
    IndexOptions,
    ThumbnailWriter,
    check_files,
    new_index,
    now,
    prepare,
    read_meta,
    read_part,
    read_span,
    remove_unreferenced,
    write_meta,
    write_part,
)

log = logging.getLogger(__name__)

#: limits on what one query may ask (the server answers 400 beyond them)
MAX_QUERY_CHARS = 1000
MAX_K = 1000
MAX_RERANK = 256
#: the language of a sentence whose sample names none
UNKNOWN_LANG = "und"
#: json fields longer than this (as JSON) are not stored with the item
JSON_FIELD_CHARS = 1024
#: json fields that hold the sentences themselves (stored as the item's texts)
TEXT_FIELDS = ("texts", "languages", "premise", "hypothesis", "question")
#: batches between progress lines when stderr is not a terminal (no progress bar)
LOG_EVERY = 20


@dataclass(frozen=True)
class Hit:
    """One search result."""

    key: str  # the sample's __key__
    score: float  # inner product of normalised embeddings (cosine); higher = better
    rank: int  # 1-based
    side: str  # which side of the index the hit is on, e.g. "image" or "text"
    caption: str  # the item's caption in the requested language (or its first one)
    language: str | None
    has_thumbnail: bool
    #: the ITM score (logit margin) when the hit was re-ranked; re-ranked hits come first
    itm: float | None = None


# --------------------------------------------------------------------------------------------
# Building


@dataclass(frozen=True)
class ItemRecord:
    """What the index keeps of a raw sample besides its vectors (runs in loader workers)."""

    captions_field: str = "captions"
    thumbnail_size: int = 128

    def __call__(self, sample: Sample, meta: dict[str, Any]) -> dict[str, Any]:
        texts = [
            [seg.lang or UNKNOWN_LANG, seg.text]
            for seg in every_segment(sample, meta, self.captions_field)
            if seg.text.strip()
        ]
        hidden = {self.captions_field, *TEXT_FIELDS}
        shown = {
            k: v
            for k, v in meta.items()
            if k not in hidden and len(json.dumps(v, ensure_ascii=False)) <= JSON_FIELD_CHARS
        }
        return {
            "shard": sample.get("__url__"),
            "texts": texts,
            "json": shown,
            "thumbnail": thumbnail(sample, self.thumbnail_size),
        }


def thumbnail(sample: Sample, size: int) -> bytes | None:
    """A JPEG of the first picture a modality plug-in makes of the sample (image, video ...)."""
    for name in MODALITIES.names():
        try:
            picture = MODALITIES.get(name).preview(sample, size)
        except ValueError as e:  # the item may still be indexed (e.g. by its regions)
            log.warning("sample %r: no thumbnail: %s", sample.get(KEY), e)
            return None
        if picture is not None:
            buf = io.BytesIO()
            picture.save(buf, "JPEG", quality=85)
            return buf.getvalue()
    return None


def build_index(
    run: str,
    shards: str,
    out: str | Path,
    *,
    add: bool = False,
    options: IndexOptions | None = None,
    batch_size: int = 128,
    workers: int = 0,
    device: str = "cpu",
    thumbnail_size: int = 128,
    overrides: Sequence[str] = (),
    strict: bool = False,
) -> dict[str, Any]:
    """Embed every sample of ``shards`` into a new index at ``out``, or ``add`` them to it.

    Adding needs the same weights the index was built with (checked by a digest of every
    weight) and keeps its type and settings; samples whose key the index already holds are
    skipped and counted, as are (on a text-only model) samples without a sentence. Shards
    are read as training reads them: a sample that cannot be read or decoded, and a shard
    that is damaged or no tar at all, is skipped and counted per shard (``damaged`` in the
    summary and in the batch's record in ``index.json``); ``strict`` makes any of them an
    error. A new index is built in a folder beside ``out`` and renamed to ``out`` once
    complete; an ``add`` that fails removes what it wrote. Returns a summary.
    """
    t0 = time.perf_counter()
    out = Path(out)
    urls = expand_shards(shards)
    if batch_size < 1 or workers < 0 or thumbnail_size < 16:
        raise ValueError("need --batch-size >= 1, --workers >= 0 and --thumbnail-size >= 16")
    checks = _check_shards(urls, strict)
    if add:
        meta = read_meta(out)
        check_files(out, meta)
        options, overrides, thumbnail_size = _kept_settings(meta, options, overrides)
    else:
        _check_new_out(out)
        options = options or IndexOptions()
    enc, ident = DualEncoder.load(run, overrides, device, batch_size)
    if add:
        check_same_weights(meta, ident, run)
    else:
        meta = _new_meta(enc, ident, overrides, options, thumbnail_size)
    work = out if add else _work_dir(out)
    try:
        summary = _add_batch(
            enc, meta, work, shards, checks, options, strict=strict, batch_size=batch_size,
            workers=workers, thumbnail_size=thumbnail_size, t0=t0,
        )  # fmt: skip
    except BaseException:
        if add:
            remove_unreferenced(out, read_meta(out))
        else:
            shutil.rmtree(work, ignore_errors=True)
        raise
    if not add:
        os.replace(work, out)
    return {"out": str(out), **summary}


def _kept_settings(
    meta: dict[str, Any], options: IndexOptions | None, overrides: Sequence[str]
) -> tuple[IndexOptions, list[str], int]:
    """The settings an ``add`` keeps (the index's); asking for others is an error."""
    if options is not None:
        raise ValueError(
            f"--add keeps the index's settings ({meta['options']}): leave out "
            "--index-type, --nlist, --m, --nprobe, --ef"
        )
    if overrides and list(overrides) != meta["overrides"]:
        raise ValueError(f"--add uses the overrides the index was built with: {meta['overrides']}")
    return IndexOptions(**meta["options"]), meta["overrides"], meta["thumbnail_size"]


def _check_new_out(out: Path) -> None:
    """A new index goes to a folder that does not exist yet, or is empty."""
    if (out / "index.json").exists():
        raise ValueError(f"{out} already holds an index: --add appends to it")
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"--out {out} is a file, not a folder")
        remove_unreferenced(out, {})  # what a build of an older mmptm left when it stopped
        if any(out.iterdir()):
            raise ValueError(f"--out {out} is a folder that is not empty")


def _work_dir(out: Path) -> Path:
    """A new folder beside ``out`` to build in (renamed to ``out`` when complete); those of
    earlier builds whose process is gone (killed) are removed."""
    parent = out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    for old in parent.glob(f".{glob.escape(out.name)}.building-*"):
        pid = old.name.rsplit("-", 1)[1]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    work = parent / f".{out.name}.building-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    return work


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _check_shards(urls: list[str], strict: bool) -> list[ShardCheck]:
    """Every shard's header scan (:func:`check_shard`); ``strict``: damage is an error
    before any work."""
    checks = [check_shard(u) for u in urls]
    for c in checks:
        if strict and c.error:
            raise ValueError(f"{c.url}: {c.error} (--strict: no damaged shard is indexed)")
    return checks


def _add_batch(
    enc: DualEncoder,
    meta: dict[str, Any],
    out: Path,
    shards: str,
    checks: list[ShardCheck],
    options: IndexOptions,
    *,
    strict: bool,
    batch_size: int,
    workers: int,
    thumbnail_size: int,
    t0: float,
) -> dict[str, Any]:
    """Embed the shards' new items into ``out`` as the index's next batch and commit it
    (``index.json``, updated in ``meta``). Returns the summary, less ``out``."""
    known = set(_item_lines(out, meta, "key"))
    first = len(known)
    b = len(meta["batches"])
    names = {"items": f"items-{b:05d}.jsonl", "thumbnails": f"thumbs-{b:05d}.tar"}
    readable = [c for c in checks if c.samples]
    parts, n_new, skipped, read = _embed_collection(
        enc, [c.url for c in readable], out, names, known, batch_size, workers,
        thumbnail_size, t0, sum(c.samples for c in readable),
    )  # fmt: skip
    damaged = _damage_report(checks, read, strict)
    skipped = {"bad": sum(d["bad"] for d in damaged), **skipped}
    summary = {"added": n_new, "skipped": skipped, "damaged": damaged}
    if not n_new:
        (out / names["items"]).unlink()
        (out / names["thumbnails"]).unlink()
        if not meta["batches"]:  # a new index
            raise ValueError(
                f"{shards}: no sample gave a vector (skipped: {skipped}; "
                f"{len(damaged)} damaged shards, see the warnings above)"
            )
        log.warning("nothing added to %s (skipped: %s)", out, skipped)
        return {**summary, "items": first, "seconds": round(time.perf_counter() - t0, 1)}
    _write_parts(out, meta, parts, options)
    meta["batches"].append(
        {**names, "n": n_new, "shards": shards, "skipped": skipped, "damaged": damaged,
         "date": now()}
    )  # fmt: skip
    meta["counts"] = {"items": first + n_new}
    for p in meta["parts"]:
        meta["counts"][p["side"]] = meta["counts"].get(p["side"], 0) + p["n"]
    meta["languages"] = sorted({p["lang"] for p in meta["parts"] if p["lang"] is not None})
    meta["updated"] = now()
    write_meta(out, meta)
    by_part = {_label(p): p["n"] for p in meta["parts"]}
    seconds = round(time.perf_counter() - t0, 1)
    return {**summary, "items": first + n_new, "parts": by_part, "seconds": seconds}


def _damage_report(
    checks: list[ShardCheck], read: Counter[str], strict: bool
) -> list[dict[str, Any]]:
    """Per shard that is damaged or lost samples: its path, its samples (by the header
    scan, those past any damage included), how many were read and decoded, how many not
    (``bad``), and what is wrong with it, where (``error``, ``offset``: a byte offset).
    Logged, one line per shard; ``strict``: the first is an error."""
    report = []
    for c in checks:
        samples = c.samples + c.lost
        bad = max(0, samples - read[c.url])
        if not (bad or c.error):
            continue
        report.append({
            "shard": c.url, "samples": samples, "read": read[c.url], "bad": bad,
            "error": c.error, "offset": c.offset,
        })  # fmt: skip
        if not samples:
            what = f"{c.url}: no sample read: {c.error}"
        else:
            what = f"{c.url}: {bad} of {samples} samples could not be read or decoded" + (
                f"; {c.error}" if c.error else " (see the warnings above)"
            )
        if strict:
            raise ValueError(f"{what} (--strict)")
        log.warning("%s", what)
    return report


#: per part (side, language or None): vectors [N,E] and rows (item, sentence) [N,2], in chunks
Parts = dict[tuple[str, str | None], tuple[list[np.ndarray], list[np.ndarray]]]


def _embed_collection(
    enc: DualEncoder,
    urls: list[str],
    out: Path,
    names: dict[str, str],
    known: set[str],
    batch_size: int,
    workers: int,
    thumbnail_size: int,
    t0: float,
    total: int,
) -> tuple[Parts, int, dict[str, int], Counter[str]]:
    """One pass over the shards (``total`` samples): every new item's vectors by part, its
    line in the items file and its thumbnail. Returns the parts, the number of new items,
    what was skipped as a duplicate or without text, and per shard the samples read."""
    item_sides = [s for s in enc.sides.values() if not s.text]
    text_sides = [s for s in enc.sides.values() if s.text]
    stream = _stream(enc, urls, batch_size, thumbnail_size)
    parts: Parts = {}
    first, read = len(known), Counter[str]()
    n_new = seen = dup = textless = 0
    bar = tqdm(total=total, unit="sample", desc="index", disable=not sys.stderr.isatty())
    with (
        open(out / names["items"], "w", encoding="utf-8") as items_file,
        closing(ThumbnailWriter(out / names["thumbnails"])) as thumbs,
        closing(bar),
    ):
        for step, batch in enumerate(single_pass(stream, workers)):
            keys, records = batch[KEY], batch[RECORD]
            seen += len(keys)
            read.update(r["shard"] for r in records)
            keep = []
            for i, key in enumerate(keys):
                if key in known:
                    dup += 1
                elif not item_sides and not records[i]["texts"]:
                    textless += 1  # a text-only model has nothing to embed of it
                else:
                    known.add(key)
                    keep.append(i)
            number_K = np.arange(first + n_new, first + n_new + len(keep))
            for s in item_sides:
                rows_K2 = np.stack([number_K, -np.ones_like(number_K)], 1)
                _collect(parts, (s.name, None), enc.embed(s.name, batch)[keep], rows_K2)
            entries = [  # (item, sentence number, language, sentence)
                (number, j, lang, text)
                for number, i in zip(number_K, keep)
                for j, (lang, text) in enumerate(records[i]["texts"])
            ]
            if entries and text_sides:
                samples = [text_sample(text, lang) for _, _, lang, text in entries]
                rows_T2 = np.array([(number, j) for number, j, _, _ in entries], dtype=np.int64)
                lang_T = np.array([lang for _, _, lang, _ in entries])
                for s in text_sides:
                    z_TE = enc.embed_samples(s.name, samples)
                    for lang in dict.fromkeys(lang_T.tolist()):
                        mine = lang_T == lang
                        _collect(parts, (s.name, lang), z_TE[mine], rows_T2[mine])
            for i in keep:
                r = records[i]
                thumb = thumbs.add(keys[i], r["thumbnail"]) if r["thumbnail"] else None
                line = {"key": keys[i], "shard": r["shard"], "texts": r["texts"], "json": r["json"]}
                items_file.write(json.dumps({**line, "thumbnail": thumb}, ensure_ascii=False))
                items_file.write("\n")
            n_new += len(keep)
            bar.update(len(keys))
            if bar.disable and (step + 1) % LOG_EVERY == 0:
                rate = seen / (time.perf_counter() - t0)
                log.info("index: %d / %d samples (%.0f samples/s)", seen, total, rate)
    return parts, n_new, {"duplicate": dup, "no_text": textless}, read


def _stream(
    enc: DualEncoder, urls: list[str], batch_size: int, thumbnail_size: int
) -> StreamConfig:
    """One ordered pass over the shards, decoded by the item sides' plug-ins, each sample
    with its item record (the reader and the skip-and-count handler of training)."""
    plugins = [p for s in enc.sides.values() if not s.text for p in s.plugins]
    record = ItemRecord(enc.captions_field, thumbnail_size)
    return StreamConfig(
        sources=[SubSource("index", urls)],
        decoder=Decoder(plugins, train=False, record=record),
        collate=Collate(plugins),
        transforms=[],
        batch_size=batch_size,
        shuffle=False,
        shuffle_buffer=0,
        drop_last=False,
    )


def _write_parts(out: Path, meta: dict[str, Any], parts: Parts, options: IndexOptions) -> None:
    """A new generation of every part that got vectors: a new FAISS index (trained if it
    must be) for a new part, the old one with the vectors added for an existing one."""
    meta["generation"] += 1
    for (side, lang), (vectors, rows) in parts.items():
        x_NE = np.ascontiguousarray(np.concatenate(vectors), dtype=np.float32)
        rows_N2 = np.concatenate(rows)
        number, part = next(
            ((n, p) for n, p in enumerate(meta["parts"]) if (p["side"], p["lang"]) == (side, lang)),
            (len(meta["parts"]), None),
        )
        if part is None:
            index, settings = new_index(options, x_NE)
            part = {"side": side, "lang": lang, **settings}
            meta["parts"].append(part)
        else:  # IVF keeps the cells trained on the first build
            index, old_rows_N2 = read_part(out, part)
            index.add(x_NE)
            rows_N2 = np.concatenate([old_rows_N2, rows_N2])
        part.update(write_part(out, number, meta["generation"], index, rows_N2), n=index.ntotal)
        meta["dim"] = int(x_NE.shape[1])


def _collect(parts: dict, name: tuple, z_NE: np.ndarray, rows_N2: np.ndarray) -> None:
    if len(z_NE):
        vectors, rows = parts.setdefault(name, ([], []))
        vectors.append(z_NE)
        rows.append(rows_N2.astype(np.int64))


def _label(part: dict[str, Any]) -> str:
    return part["side"] if part["lang"] is None else f"{part['side']}/{part['lang']}"


def _new_meta(
    enc: DualEncoder, ident: dict, overrides: Sequence[str], options: IndexOptions, thumb: int
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        **ident,
        "overrides": list(overrides),
        "sides": {n: {"partner": s.partner, "text": s.text} for n, s in enc.sides.items()},
        "objectives": {n: c.type for n, c in enc.model.cfg.objectives.items()},
        "rerank": enc.itm is not None,
        "metric": "inner_product",
        "dim": 0,
        "options": asdict(options),
        "thumbnail_size": thumb,
        "generation": -1,
        "parts": [],
        "batches": [],
        "counts": {"items": 0},
        "languages": [],
        "created": now(),
        "updated": now(),
    }


def check_same_weights(meta: dict[str, Any], ident: dict[str, Any], run: str) -> None:
    """An index holds the vectors of one model: refuse a run with other weights."""
    if ident["fingerprint"] != meta["fingerprint"]:
        raise ValueError(
            f"{run} holds other weights than the run the index was built with "
            f"({meta['checkpoint']}, step {meta['step']}): the vectors of two models do not "
            "compare (build a new index for this run)"
        )


def _item_lines(path: Path, meta: dict[str, Any], field: str | None = None) -> list[Any]:
    """The committed items (or one field of each), batch by batch."""
    out = []
    for batch in meta["batches"]:
        f = path / batch["items"]
        with open(f, encoding="utf-8") as lines:
            items = [_item(f, n, line) for n, line in zip(range(batch["n"]), lines)]
        if len(items) < batch["n"]:
            raise DamagedIndex(f"{f}: {len(items)} items where index.json records {batch['n']}")
        out += items if field is None else [item[field] for item in items]
    return out


def _item(f: Path, number: int, line: str) -> dict[str, Any]:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise DamagedIndex(f"{f}: line {number + 1} is not JSON ({e})") from None


# --------------------------------------------------------------------------------------------
# Searching


@dataclass
class _Part:
    side: str
    lang: str | None
    index: faiss.Index
    #: row → (item number, text number or -1) [N,2]
    rows: np.ndarray


class SearchIndex:
    """An index directory and the run it was built with, ready to answer queries."""

    def __init__(self, path: Path, meta: dict[str, Any], enc: DualEncoder) -> None:
        self.path = path
        self.meta = meta
        self.enc = enc
        self.parts = [_Part(p["side"], p["lang"], *read_part(path, p)) for p in meta["parts"]]
        self.set_search()
        #: captions shown when a query names no language: the run's first caption language
        trained = [lang for lang in enc.caption_languages if lang in meta["languages"]]
        self.default_lang = trained[0] if trained else None
        items = _item_lines(path, meta)
        self.keys = [it["key"] for it in items]
        self.number = {k: i for i, k in enumerate(self.keys)}
        self.items = items
        #: per item: (batch, offset, size) of its thumbnail, or None
        starts = np.cumsum([0] + [b["n"] for b in meta["batches"]])
        batch_of = np.searchsorted(starts, np.arange(len(items)), side="right") - 1
        self.thumbs = [
            (int(b), *it["thumbnail"]) if it["thumbnail"] else None
            for b, it in zip(batch_of, items)
        ]

    @classmethod
    def open(
        cls, path: str | Path, *, device: str = "cpu", run: str | None = None, verify: bool = False
    ) -> SearchIndex:
        """Load an index and its model (the checkpoint it was built with, unless ``run``).
        Every file's size is compared with ``index.json``'s record, and with ``verify`` its
        SHA-256: a damaged file is a :class:`~mmptm.search.store.DamagedIndex` naming it."""
        meta = read_meta(path)
        check_files(Path(path), meta, verify=verify)
        source = run or meta["checkpoint"]
        if run is None and not Path(source).exists():
            raise FileNotFoundError(
                f"{path}: the checkpoint it was built with, {source}, is gone; pass the run "
                "(one with the same weights) explicitly"
            )
        enc, ident = DualEncoder.load(source, meta["overrides"], device)
        check_same_weights(meta, ident, source)
        return cls(Path(path), meta, enc)

    def set_search(self, *, nprobe: int | None = None, ef: int | None = None) -> None:
        """Query-time settings of the approximate parts (default: the index's own):
        ``nprobe`` for an IVF index, ``ef`` for an HNSW one (an error for another type)."""
        opts = self.meta["options"]
        for name, value, kind in (("nprobe", nprobe, "ivf"), ("ef", ef, "hnsw")):
            if value is not None and opts["type"] != kind:
                raise ValueError(f"--{name} applies to {kind} indexes; this one is {opts['type']}")
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"--{name} must be an integer >= 1, got {value!r}")
        nprobe, ef = nprobe or opts["nprobe"], ef or opts["ef"]
        for p in self.parts:
            prepare(p.index, nprobe, ef)

    @property
    def info(self) -> dict[str, Any]:
        """index.json, with per side its vector count and languages."""
        sides = {}
        for name, s in self.meta["sides"].items():
            mine = [p for p in self.parts if p.side == name]
            langs = sorted(p.lang for p in mine if p.lang is not None)
            sides[name] = {**s, "n": sum(p.index.ntotal for p in mine), "languages": langs}
        return {**self.meta, "sides": sides, "items": len(self.keys)}

    # -- queries ---------------------------------------------------------------------------

    def search_text(
        self,
        query: str,
        k: int = 10,
        *,
        lang: str | None = None,
        side: str | None = None,
        rerank_k: int = 0,
        query_lang: str | None = None,
    ) -> list[Hit]:
        """A typed query → the items of ``side`` (default: the non-text side, else the
        partner of the text side). ``lang`` picks the captions shown and, on a text side,
        the language searched (None: all); ``query_lang`` is the query's own language
        (default ``lang``; models with language embeddings read it). ``rerank_k``: ITM
        re-scores the first stage's top ``rerank_k`` (a fusion model's ITM head)."""
        text = query.strip() if isinstance(query, str) else ""
        if not text:
            raise ValueError("the query is empty")
        if len(text) > MAX_QUERY_CHARS:
            raise ValueError(f"the query has {len(text)} characters; at most {MAX_QUERY_CHARS}")
        self._check(k, lang)
        self._check_query_lang(query_lang)
        target = self._side(side or self._default_for_text())
        partner = self.enc.sides[target.partner]
        q_side = partner if partner.text else target
        if not q_side.text:
            raise ValueError(
                f"side {target.name!r} cannot be searched with text: the model's sides "
                f"{list(self.enc.sides)} read no text"
            )
        if rerank_k:
            self._check_rerank(rerank_k, target.name)
        query_sample = text_sample(text, query_lang or lang or "")
        z_E = self.enc.embed_samples(q_side.name, [query_sample])[0]
        found = self._search(z_E, target.name, lang, max(k, rerank_k))
        if rerank_k:
            found = self._rerank(found, rerank_k, target.name, q_side.name, query_sample)
        return self._hits(found[:k], target.name, lang)

    def search_image(
        self,
        image: bytes | Image.Image,
        k: int = 10,
        *,
        side: str | None = None,
        lang: str | None = None,
        max_pixels: int = MAX_IMAGE_PIXELS,
    ) -> list[Hit]:
        """An image (file bytes or a PIL image) → the items of ``side`` (default: the side
        the model aligns images with, e.g. text; or the image side itself). File bytes are
        decoded at the size the model needs (``images.shrink``; ``ValueError`` past
        ``max_pixels``)."""
        self._check(k, lang)
        q_side = self._image_side()
        if isinstance(image, (bytes, bytearray, memoryview)):
            image = shrink(bytes(image), self.image_size or 0, max_pixels)
        data, ext = _image_member(image)
        target = self._side(side or q_side.partner)
        z_E = self.enc.embed_samples(q_side.name, [{KEY: "query", ext: data}])[0]
        return self._hits(self._search(z_E, target.name, lang, k), target.name, lang)

    def search_key(
        self, key: str, k: int = 10, *, side: str | None = None, lang: str | None = None
    ) -> list[Hit]:
        """More like this: the stored vector of item ``key`` on ``side`` (default: the first
        side it has a vector on, non-text first) → its nearest items there, itself left out.
        On a text side the item's sentence in ``lang`` is the query, and ``lang`` the
        language searched."""
        item = self._number(key)
        self._check(k, lang)
        order = sorted(self.enc.sides.values(), key=lambda s: s.text)
        sides = [self._side(side)] if side else order
        for s in sides:
            for p in sorted(self._parts(s.name, None), key=lambda p: p.lang != lang):
                rows = np.flatnonzero(p.rows[:, 0] == item)
                if len(rows):
                    z_E = p.index.reconstruct(int(rows[0]))
                    found = self._search(z_E, s.name, lang, k, exclude=item)
                    return self._hits(found, s.name, lang)
        raise ValueError(f"item {key!r} has no vector on side {side!r}")

    def thumbnail(self, key: str) -> bytes:
        """The item's JPEG thumbnail; ``KeyError`` if it has none."""
        where = self.thumbs[self._number(key)]
        if where is None:
            raise KeyError(f"item {key!r} has no thumbnail")
        batch, offset, size = where
        return read_span(self.path / self.meta["batches"][batch]["thumbnails"], offset, size)

    def item(self, key: str) -> dict[str, Any]:
        """Everything stored about one item: its sentences by language, json fields, shard,
        whether it has a thumbnail, and how many vectors it has per side."""
        number = self._number(key)
        it = self.items[number]
        texts: dict[str, list[str]] = {}
        for lang, text in it["texts"]:
            texts.setdefault(lang, []).append(text)
        vectors = {s: 0 for s in self.enc.sides}
        for p in self.parts:
            vectors[p.side] += int((p.rows[:, 0] == number).sum())
        return {
            "key": key,
            "texts": texts,
            "json": it["json"],
            "shard": it["shard"],
            "has_thumbnail": self.thumbs[number] is not None,
            "vectors": vectors,
        }

    # -- internals -------------------------------------------------------------------------

    def _number(self, key: str) -> int:
        if key not in self.number:
            raise KeyError(f"no item {key!r} in the index")
        return self.number[key]

    def _side(self, name: str):
        if name not in self.enc.sides:
            raise ValueError(f"unknown side {name!r}; this index has {list(self.enc.sides)}")
        return self.enc.sides[name]

    def _default_for_text(self) -> str:
        first = next((s for s in self.enc.sides.values() if not s.text), None)
        return first.name if first else next(iter(self.enc.sides.values())).partner

    def _check(self, k: int, lang: str | None) -> None:
        if not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ValueError(f"k must be an integer in 1..{MAX_K}, got {k!r}")
        if lang is not None and lang not in self.meta["languages"]:
            raise ValueError(f"unknown language {lang!r}; the index has {self.meta['languages']}")

    def _check_query_lang(self, query_lang: str | None) -> None:
        """A query's language must be one the index holds or the model's tokenizer knows."""
        known = sorted({*self.meta["languages"], *self.enc.languages})
        if query_lang is not None and query_lang not in known:
            raise ValueError(f"unknown query language {query_lang!r}; known: {known}")

    def _image_side(self) -> Side:
        """The side that reads image files (``ValueError`` if none does)."""
        for s in self.enc.sides.values():
            if not s.text and s.reads("png"):
                return s
        raise ValueError(f"no side of this index's model reads images: {list(self.enc.sides)}")

    @property
    def image_size(self) -> int | None:
        """The side of the square input the model's image queries are fitted to (the
        largest its plug-ins ask; 0 if none says), None when no side reads images."""
        try:
            side = self._image_side()
        except ValueError:
            return None
        return max(getattr(p.cfg, "size", 0) or 0 for p in side.plugins)

    def _check_rerank(self, rerank_k: int, side: str) -> None:
        if not isinstance(rerank_k, int) or not 0 <= rerank_k <= MAX_RERANK:
            raise ValueError(f"rerank_k must be an integer in 0..{MAX_RERANK}, got {rerank_k!r}")
        if self.enc.itm is None:
            raise ValueError(
                "--rerank-k needs an ITM head (a fusion model, ALBEF style); this model's "
                f"objectives are {objective_types(self.enc.model)}"
            )
        if self.enc.sides[side].text:
            raise ValueError(f"re-ranking scores a sentence against items: side {side!r} is text")

    def _parts(self, side: str, lang: str | None) -> list[_Part]:
        return [
            p for p in self.parts if p.side == side and (lang is None or p.lang in (None, lang))
        ]

    def _search(
        self, z_E: np.ndarray, side: str, lang: str | None, k: int, exclude: int = -1
    ) -> list[tuple[float, int, int, float | None]]:
        """(score, item, text number, ITM score) of the best ``k`` rows of ``side``'s parts
        (only ``lang``'s on a text side), best first; rows of item ``exclude`` left out."""
        q_1E = np.ascontiguousarray(z_E[None], dtype=np.float32)
        found = []
        for p in self._parts(side, lang):
            extra = int((p.rows[:, 0] == exclude).sum()) if exclude >= 0 else 0
            kk = min(k + extra, p.index.ntotal)
            if kk < 1:
                continue
            D_1K, I_1K = p.index.search(q_1E, kk)
            for score, row in zip(D_1K[0], I_1K[0]):
                if row >= 0 and p.rows[row, 0] != exclude:
                    found.append((float(score), int(p.rows[row, 0]), int(p.rows[row, 1]), None))
        found.sort(key=lambda f: -f[0])
        return found[:k]

    def _rerank(self, found: list, rerank_k: int, side: str, text_side: str, query: Sample) -> list:
        """ITM scores of the top ``rerank_k``; those come first, ordered by
        :func:`albef_rerank_score` (as evaluation)."""
        top = found[:rerank_k]
        samples = []
        for _, number, _, _ in top:
            shard, key = self.items[number]["shard"], self.keys[number]
            try:
                samples.append(read_sample(shard, key))
            except (OSError, KeyError, TypeError) as e:
                raise ValueError(
                    f"re-ranking reads items back from the shards they were indexed from: "
                    f"item {key!r} ({Path(shard).name}): {e}"
                ) from None
        itm_K = self.enc.rerank_scores(side, samples, text_side, query)
        cosine_K = np.array([score for score, *_ in top])
        combined_K = albef_rerank_score(itm_K, cosine_K, self.enc.head)
        order = np.argsort(-combined_K, kind="stable")
        reranked = [(*top[o][:3], float(itm_K[o])) for o in order]
        return reranked + found[rerank_k:]

    def _hits(self, found: list, side: str, lang: str | None) -> list[Hit]:
        hits = []
        for rank, (score, number, j, itm) in enumerate(found, 1):
            texts = self.items[number]["texts"]
            if j >= 0:
                language, caption = texts[j]
            else:
                shown = lang or self.default_lang
                language, caption = next(
                    (t for t in texts if t[0] == shown), texts[0] if texts else (None, "")
                )
            hits.append(
                Hit(
                    key=self.keys[number],
                    score=score,
                    rank=rank,
                    side=side,
                    caption=caption,
                    language=language,
                    has_thumbnail=self.thumbs[number] is not None,
                    itm=itm,
                )
            )
        return hits


#: formats the image plug-in reads as they are (a GIF: its first frame)
_IMAGE_FORMATS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif"}


def _image_member(image: bytes | Image.Image) -> tuple[bytes, str]:
    """(bytes, member extension) of an image query; other formats are re-encoded as PNG in
    their own mode where PNG stores it, so that the plug-in resizes them as open_clip does
    (in their mode, then to RGB)."""
    if isinstance(image, Image.Image):
        picture = image
    elif isinstance(image, (bytes, bytearray, memoryview)):
        try:
            with Image.open(io.BytesIO(bytes(image))) as img:
                img.load()
                if img.format in _IMAGE_FORMATS:
                    return bytes(image), _IMAGE_FORMATS[img.format]
                picture = img.copy()
        except UnidentifiedImageError:
            raise ValueError("not a decodable image: no image format PIL reads") from None
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            raise ValueError(f"not a decodable image: {e}") from None
    else:
        raise ValueError(
            f"an image query is the bytes of an image file, got {type(image).__name__}"
        )
    if picture.mode not in PNG_MODES:  # e.g. CMYK (a TIFF)
        picture = picture.convert("RGBA" if "A" in picture.mode else "RGB")
    buf = io.BytesIO()
    picture.save(buf, "PNG")
    return buf.getvalue(), "png"


def format_hits(hits: Sequence[Hit], width: int = 100) -> str:
    """A plain-text table: rank, score (and ITM score after re-ranking), key, language,
    caption (cut to ``width`` characters)."""
    itm = any(h.itm is not None for h in hits)
    keyw = max([len("key"), *(len(h.key) for h in hits)])
    head = f"{'rank':>4} {'score':>7} " + (f"{'itm':>7} " if itm else "")
    lines = [head + f"{'key':<{keyw}} lang caption"]
    for h in hits:
        caption = h.caption if len(h.caption) <= width else h.caption[: width - 1] + "…"
        row = f"{h.rank:>4} {h.score:>7.4f} "
        if itm:
            row += f"{h.itm:>7.3f} " if h.itm is not None else f"{'-':>7} "
        lines.append(row + f"{h.key:<{keyw}} {h.language or '-':<4} {caption}")
    return "\n".join(lines)
