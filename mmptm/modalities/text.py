"""The text plug-in: sentences from a sample's ``txt``/``json``, tokenised, padded, paired.

A sample gives one or two **segments** depending on its format (read from its ``json``):

    image-text (img2dataset, toyworld)   json.captions[lang] or txt   → one
    monolingual text                     txt + json.language          → one
    parallel pair                        json.languages + json.texts  → two
    NLI pair                             json.premise / hypothesis    → two
    VQA question                         json.question                → one

A training sample's caption may come from one of several json fields of the captions' shape,
drawn by weight (``caption_mixture``: e.g. toyworld's object, pair and scene captions, so that
a model learns short queries as well as whole scenes); evaluation reads ``captions_field``.

The first segment fills the ``text`` view (``input_ids``, ``attention_mask``, ``segment_ids``,
``lang_ids``), the second the second view (``text2_input_ids`` ...). Models with an encoder
for the second view read them apart; the others get them packed by :class:`PackPairs`:
joined into one sequence (XLM's TLM layout, BERT's pair layout) or, for sources with
``pairs: stack``, stacked as separate rows (sentence-level contrastive).

**A joined pair's layout** is what the model was pre-trained with, in three settings
(:attr:`TextData.layout`): ``segments`` (2: segment ids 0 / 1; 1: all 0, for models with one
segment embedding), ``separators`` (1: ``[CLS] a [SEP] b [SEP]``; 2: ``<s> a </s></s> b
</s>``) and ``restart_positions``. BERT is 2 / 1 / false, XLM's TLM 2 / 1 / true, XLM-R and
RoBERTa 1 / 2 / false. A run started from another (``init=``) takes them from it, so a task
recipe fine-tunes every model in its own layout.

**Annotations as character spans** (``Config.spans``: batch name → json field) become
per-token keys: ``<name>_ids [B,L]`` holds a span's value (an integer id, e.g. an entity) at
the first piece of the span and -1 elsewhere, ``<name>_mask [B,L]`` is True on every piece
inside a span. The field mirrors the text it annotates: a list of ``[start, end, id]``
(characters, end exclusive) for ``txt`` / ``question``; ``{lang: [...]}`` for
``captions`` (``{lang: [[...], ...]}``, one list per caption, when a language has several);
``[[...], [...]]`` for a pair's ``texts``; ``{"premise": [...],
"hypothesis": [...]}`` for NLI. Joining and stacking pairs keeps every per-token key.
An id is an integer (the row itself) or, with ``Config.span_vocabularies`` (batch name → an
id list, one id per line: ``entities.txt`` of ``mmptm kg train-embeddings``), an id string
such as Wikidata's "Q42" (what ``mmptm data link`` writes), looked up to its row; a string
the list lacks is dropped and counted (``unknown_ids``, logged), never a bad sample.

**Object tags** (Oscar): with ``Config.tag_classes`` (the detector's class names, label i →
``tag_classes[i]``) each sample gets a second segment, the labels of its ``regions.npz``
regions in region order, named and joined by spaces ("circle square star"). It is the second
sentence of the sample's only text view, so :class:`PackPairs` lays out ``[CLS] caption [SEP]
tags [SEP]`` with segment ids 0 / 1; a sample that is already a pair cannot take tags.

Legend: B batch, L tokens.
"""

from __future__ import annotations

import logging
import math
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from mmptm.batch import KEY, PAIRS, Batch, batch_source
from mmptm.modalities.base import DataContext, Modality, Sample, read_id_list, view_prefix
from mmptm.modalities.regions_io import MEMBER as REGIONS_MEMBER
from mmptm.modalities.regions_io import load_regions
from mmptm.modalities.sentences import Segment, segments
from mmptm.registry import MODALITIES

log = logging.getLogger(__name__)

_NAME = re.compile(r"[a-z][a-z0-9_]*")
#: the view a pair's second sentence fills when the model reads one text view (before packing)
SECOND_VIEW = "text2"


@MODALITIES.register("text")
class TextData(Modality):
    """Tokenised sentences, one or two per sample (see the module docstring)."""

    members: ClassVar[tuple[str, ...]] = ("txt", "json", REGIONS_MEMBER)
    max_views: ClassVar[int] = 2
    #: settings that describe the layout the model was pre-trained with (module docstring):
    #: a run started from another (``init=``) takes them from it
    layout: ClassVar[tuple[str, ...]] = ("segments", "separators", "restart_positions")

    @dataclass
    class Config:
        type: str = "text"
        #: tokens per sentence, [CLS] and [SEP] included (longer sentences lose their tail)
        max_len: int = 40
        #: caption languages (keys of ``json["captions"]``): one is drawn per sample and
        #: epoch when training, the first available when evaluating; the ``txt`` member is
        #: the fallback when a sample has none of them
        caption_languages: list[str] = field(default_factory=lambda: ["en"])
        #: the json field holding the captions ({lang: caption or [captions]}); e.g.
        #: ``reversed_captions`` scores toyworld video's reversal test
        captions_field: str = "captions"
        #: which of a language's several captions evaluation reads (0 = the first); the
        #: five-captions retrieval protocol (Clotho, AudioCaps) reads each in turn
        caption_index: int = 0
        #: json fields of the same shape to draw each training sample's caption from, with
        #: weights, e.g. toyworld's granularities {captions: 2, pair_captions: 1,
        #: object_captions: 1}; a field is drawn (per sample and epoch) among those holding a
        #: caption in one of ``caption_languages``, the sample keeps ``captions_field`` when
        #: it holds none of them. Empty = ``captions_field`` alone; evaluation always reads it
        caption_mixture: dict[str, float] = field(default_factory=dict)
        #: a joined pair restarts positions at its second sentence (XLM's TLM)
        restart_positions: bool = True
        #: segment ids of a joined pair: 2 = 0 for the first sentence, 1 for the second
        #: (BERT, XLM); 1 = 0 throughout (XLM-R and RoBERTa have one segment embedding)
        segments: int = 2
        #: [SEP]s between a joined pair's sentences: 1 = ``[CLS] a [SEP] b [SEP]`` (BERT,
        #: XLM); 2 = ``<s> a </s></s> b </s>`` (XLM-R, RoBERTa)
        separators: int = 1
        #: character-span annotations → per-token keys: batch name → json field, e.g.
        #: {entity: entities} gives ``entity_ids`` and ``entity_mask``
        spans: dict[str, str] = field(default_factory=dict)
        #: object tags as a second segment (Oscar; module docstring): the detector's class
        #: names, by label id; empty = no tags. Declared by the text encoder (its
        #: ``tag_classes``), so a fine-tuning run initialised from it reads tags too
        tag_classes: list[str] = field(default_factory=list)
        #: span name → id list file (row i = line i) that maps string ids to rows, e.g.
        #: {entity: runs/kg/entities.txt}
        span_vocabularies: dict[str, str] = field(default_factory=dict)

    def __init__(self, cfg: Config, *, views: Sequence[str], context: DataContext) -> None:
        super().__init__(cfg, views=views, context=context)
        tok = context.tokenizer
        if tok is None:
            raise ValueError("the text modality needs a tokenizer (data.tokenizer)")
        if cfg.max_len < 3:
            raise ValueError(f"data.modalities.text.max_len must be >= 3, got {cfg.max_len}")
        for key in ("segments", "separators"):
            if getattr(cfg, key) not in (1, 2):
                raise ValueError(
                    f"data.modalities.text.{key} must be 1 or 2, got {getattr(cfg, key)}"
                )
        for name in cfg.spans:
            if not _NAME.fullmatch(name):
                raise ValueError(f"data.modalities.text.spans: {name!r} is not a batch-key name")
        _check_mixture(cfg)
        self.tokenizer = tok
        self.vocabularies = {}
        for name, path in cfg.span_vocabularies.items():
            if name not in cfg.spans:
                raise ValueError(
                    f"data.modalities.text.span_vocabularies: {name!r} is not a span name "
                    f"({sorted(cfg.spans)})"
                )
            self.vocabularies[name] = read_id_list(path)
        #: per span name: string ids the vocabulary lacks, dropped (in this process)
        self.unknown_ids: Counter[str] = Counter()
        #: per-token keys and their padding value; "position_ids" appears once pairs are joined
        self.fills: dict[str, int | bool] = {
            "input_ids": tok.pad_id,
            "attention_mask": False,
            "segment_ids": 0,
            "lang_ids": 0,
        }
        for name in cfg.spans:
            self.fills.update({f"{name}_ids": -1, f"{name}_mask": False})
        # Where a pair's sentences go: the two views the model reads, or (one view) the first
        # and the default name of a second, which PackPairs then joins or stacks.
        second = self.views[1] if len(self.views) == 2 else SECOND_VIEW
        self.prefixes = [self.prefix(self.views[0]), view_prefix(self.name, second)]
        if cfg.tag_classes and len(self.views) == 2:
            raise ValueError(
                f"data.modalities.text.tag_classes: object tags are the second segment of one "
                f"text view, but the model reads two ({self.views})"
            )
        stacked = sorted(s for s, how in context.pairs.items() if how == "stack")
        if stacked and len(self.views) == 2:
            raise ValueError(
                f"data.sources {stacked} stack pairs into rows of one text view, but the model "
                f"reads the second sentence apart (view {self.views[1]!r}): drop one of them"
            )

    @property
    def keys(self) -> tuple[str, ...]:  # type: ignore[override]
        return (*self.fills, "position_ids")

    def lang_index(self, lang: str) -> int:
        languages = self.tokenizer.languages
        return languages.index(lang) if lang in languages else 0

    def encode(self, text: str, lang: str, spans: Mapping[str, Any] | None = None) -> Sample:
        """One sentence as a sample part: ids with [CLS]/[SEP], its language, span keys."""
        tok = self.tokenizer
        if self.cfg.spans:
            ids, offsets = tok.encode_with_offsets(text)
        else:
            ids, offsets = tok.encode(text), []
        input_ids, _ = tok.build_inputs(ids, None, self.cfg.max_len)
        out: Sample = {"input_ids": input_ids, "lang": lang}
        if self.cfg.spans:
            kept = [(0, 0), *offsets[: len(input_ids) - 2], (0, 0)]  # [CLS] ... [SEP]
            for name in self.cfg.spans:
                ids, inside, unknown = _token_spans(
                    (spans or {}).get(name) or [], kept, len(text), name,
                    self.vocabularies.get(name),
                )  # fmt: skip
                out[f"{name}_ids"], out[f"{name}_mask"] = ids, inside
                if unknown:
                    self._count_unknown(name, unknown)
        return out

    def _count_unknown(self, name: str, n: int) -> None:
        before = self.unknown_ids[name]
        self.unknown_ids[name] += n
        if before == 0 or len(str(before)) != len(str(before + n)):  # at 1, 10, 100, ...
            log.warning("%s spans: %d ids so far are not in %s; dropped", name,
                        self.unknown_ids[name], self.cfg.span_vocabularies[name])  # fmt: skip

    def _spans(self, meta: Mapping[str, Any], seg: Segment) -> dict[str, Any]:
        """The span annotations of one segment, found where its text was (module docstring)."""
        found = {}
        head = seg.where[0]
        if head == "tags":  # object tags carry no span annotations
            return {}
        for name, fieldname in self.cfg.spans.items():
            value: Any = meta.get(fieldname)
            if value is None or head in ("txt", "question"):
                found[name] = value
                continue
            if head == "texts":
                ok = isinstance(value, list) and len(value) == 2
                found[name] = value[int(seg.where[1])] if ok else None
            else:  # captions by language, NLI by field name; a missing key: no annotation
                ok = isinstance(value, dict)
                at = seg.where[1] if head == self.cfg.captions_field else head
                found[name] = value.get(at) if ok else None
                if ok and len(seg.where) == 3:  # one of a language's several captions
                    many = found[name]
                    ok = many is None or (isinstance(many, list) and len(many) > seg.where[2])
                    found[name] = many[seg.where[2]] if ok and many is not None else None
            if not ok:
                raise ValueError(
                    f"json {fieldname!r} does not mirror the text it annotates "
                    f"({'/'.join(map(str, seg.where))})"
                )
        return found

    def tags(self, sample: Sample) -> str:
        """The object tags of a sample: its regions' detector labels as words, region order."""
        if REGIONS_MEMBER not in sample:
            raise ValueError(f"object tags need a {REGIONS_MEMBER} member; has {sorted(sample)}")
        labels = load_regions(sample[REGIONS_MEMBER]).get("labels")
        if labels is None:
            raise ValueError(f"object tags need the detector labels; {REGIONS_MEMBER} has none")
        names = self.cfg.tag_classes
        bad = [int(i) for i in labels if not 0 <= i < len(names)]
        if bad:
            raise ValueError(
                f"{REGIONS_MEMBER} label {bad[0]} has no name in tag_classes ({len(names)} names)"
            )
        return " ".join(names[i] for i in labels)

    def caption_field(self, meta: Mapping[str, Any], rng: random.Random | None) -> str:
        """The json field a sample's caption comes from: one of ``caption_mixture`` drawn by
        weight when training (among those with a caption in ``caption_languages``), else
        ``captions_field``. One field on offer draws nothing from ``rng``."""
        mixture = self.cfg.caption_mixture
        if rng is None or not mixture:
            return self.cfg.captions_field
        langs = self.cfg.caption_languages
        offered = [(f, w) for f, w in mixture.items() if _has_caption(meta.get(f), langs)]
        if len(offered) < 2:
            return offered[0][0] if offered else self.cfg.captions_field
        at = rng.random() * sum(w for _, w in offered)
        for name, weight in offered:
            at -= weight
            if at < 0:
                return name
        return offered[-1][0]  # float rounding left ``at`` at the very end

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        segs = segments(
            sample,
            meta,
            self.cfg.caption_languages,
            rng,
            self.caption_field(meta, rng),
            self.cfg.caption_index,
        )
        if self.cfg.tag_classes:
            if len(segs) > 1:
                raise ValueError("the sample is a sentence pair; object tags need a single text")
            segs.append(Segment(self.tags(sample), segs[0].lang, ("tags",)))
        if len(self.views) == 2 and len(segs) < 2:
            raise ValueError(f"the model reads a second text view ({self.views[1]}); sample has 1")
        out: Sample = {}
        for prefix, seg in zip(self.prefixes, segs):
            item = self.encode(seg.text, seg.lang, self._spans(meta, seg))
            out.update({prefix + k: v for k, v in item.items()})
        return out

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        batch: dict[str, Any] = {}
        for p in self.prefixes:
            if f"{p}input_ids" not in samples[0]:
                continue
            lengths = [len(s[f"{p}input_ids"]) for s in samples]
            B, L = len(samples), max(lengths)
            for key, fill in self.fills.items():
                if key in ("attention_mask", "segment_ids", "lang_ids"):
                    continue
                t = torch.full((B, L), fill, dtype=torch.bool if fill is False else torch.long)
                for i, s in enumerate(samples):
                    t[i, : lengths[i]] = torch.tensor(s[f"{p}{key}"], dtype=t.dtype)
                batch[f"{p}{key}"] = t
            batch[f"{p}attention_mask"] = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
            batch[f"{p}segment_ids"] = torch.zeros(B, L, dtype=torch.long)
            lang_B = torch.tensor([self.lang_index(s[f"{p}lang"]) for s in samples])
            batch[f"{p}lang_ids"] = lang_B[:, None].expand(-1, L).contiguous()
        return batch

    def transforms(self) -> list[Any]:
        stages: list[Any] = []
        if len(self.views) == 1:  # a pair's second sentence joins or stacks onto the first
            stack = frozenset(s for s, how in self.context.pairs.items() if how == "stack")
            first, second = self.prefixes
            c = self.cfg
            # only a second separator needs the tokenizer's [SEP] id
            sep_id = self.tokenizer.sep_id if c.separators == 2 else -1
            layout = {"segments": c.segments, "separators": c.separators, "sep_id": sep_id}
            stages.append(
                PackPairs(self.fills, first, second, c.restart_positions, stack, **layout)
            )
        if self.context.pack:
            if len(self.views) == 2:
                raise ValueError(
                    f"data.sources {sorted(self.context.pack)} pack rows, but the model reads "
                    f"two text views ({self.views}): packing needs one"
                )
            stages.append(PackRows(dict(self.context.pack), self.prefixes[0], self.fills))
        return stages


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_mixture(cfg: TextData.Config) -> None:
    """``caption_mixture``: json field names with positive weights, and no span annotations
    (a span field mirrors one caption field, not several)."""
    where = "data.modalities.text.caption_mixture"
    for name, weight in cfg.caption_mixture.items():
        if not name:
            raise ValueError(f"{where}: a field name is empty")
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"{where}.{name} must be a positive weight, got {weight}")
    if cfg.caption_mixture and cfg.spans:
        raise ValueError(
            f"{where} draws captions from several json fields, but data.modalities.text.spans "
            f"({sorted(cfg.spans)}) mirror one: use one of them"
        )


def _has_caption(value: Any, languages: Sequence[str]) -> bool:
    """Whether a captions field ({lang: caption or [captions]}) holds one in ``languages``."""
    return isinstance(value, dict) and any(value.get(lang) for lang in languages)


def _token_spans(
    spans: Any,
    offsets: Sequence[tuple[int, int]],
    n_chars: int,
    name: str,
    vocab: Mapping[str, int] | None = None,
) -> tuple[list[int], list[bool], int]:
    """Per-token (value at a span's first piece else -1, inside-a-span mask) of one sentence,
    and how many string ids ``vocab`` lacks (those spans are dropped)."""
    ids, inside = [-1] * len(offsets), [False] * len(offsets)
    unknown = 0
    if not isinstance(spans, list):
        raise ValueError(f"{name} spans must be a list of [start, end, id], got {spans!r}")
    for span in spans:
        ok = isinstance(span, (list, tuple)) and len(span) == 3
        ok = ok and _is_int(span[0]) and _is_int(span[1])
        ok = ok and (_is_int(span[2]) or (vocab is not None and isinstance(span[2], str)))
        if not ok:
            kind = "an integer or an id string" if vocab is not None else "an integer"
            raise ValueError(f"{name} span {span!r} is not [start, end, id] (id: {kind})")
        start, end, value = span
        if isinstance(value, str):
            if value not in vocab:  # type: ignore[operator]
                unknown += 1
                continue
            value = vocab[value]  # type: ignore[index]
        if not 0 <= start < end <= n_chars or value < 0:
            raise ValueError(
                f"{name} span {span!r} is outside the text ({n_chars} characters) or has a "
                "negative id"
            )
        covered = [t for t, (a, b) in enumerate(offsets) if a < b and a < end and b > start]
        for t in covered:  # a span cut off by truncation covers no piece: nothing to mark
            inside[t] = True
        if covered and ids[covered[0]] < 0:
            ids[covered[0]] = value
    return ids, inside, unknown


@dataclass
class PackPairs:
    """Packs a pair's two sentences for a model with one text view (a transform, priority 15).

    Joined (default): ``[CLS] a [SEP] b [SEP]`` (the second [CLS] dropped), segment ids
    0 / 1, every other per-token key (language ids, span keys) carried along, positions
    restarting at ``b`` with ``restart_positions`` (XLM's TLM) or continuing (BERT). With
    ``separators=2`` the second [CLS] becomes a second [SEP] (``<s> a </s></s> b </s>``,
    XLM-R); with ``segments=1`` every segment id is 0.
    Batches of the sources in ``stack``: rows 0..B-1 hold the first sentences and rows
    B..2B-1 their partners, each ``[CLS] x [SEP]`` encoded alone, and ``__pairs__`` is
    "stacked" (what a contrastive objective over ``[text, text]`` aligns, as InfoXLM's XLCO).
    Runs after negative sampling (which swaps whole second-sentence rows), before masking.
    """

    data_priority: ClassVar[int] = 15

    #: per-token keys → padding value (``input_ids``: the pad id)
    fills: dict[str, int | bool]
    #: key prefixes of the first sentence ("" for the ``text`` view) and the second ("text2_")
    first: str = ""
    second: str = "text2_"
    restart_positions: bool = True
    #: ``data.sources`` names whose pairs are stacked rather than joined
    stack: frozenset[str] = frozenset()
    #: 2: the second sentence's segment id is 1; 1: it is 0 as the first's
    segments: int = 2
    #: [SEP]s between the sentences (2: b's [CLS] slot holds ``sep_id``)
    separators: int = 1
    sep_id: int = -1

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        if f"{self.second}input_ids" not in batch:
            return batch
        if batch_source(batch) in self.stack:
            return self._stack(batch)
        a, b = self.first, self.second
        skip = 2 - self.separators  # b's leading columns left out: its [CLS] with one [SEP]
        a_mask, b_mask = batch[f"{a}attention_mask"], batch[f"{b}attention_mask"][:, skip:]
        len_a_B, len_b_B = a_mask.sum(1), b_mask.sum(1)
        B, L = a_mask.shape[0], int((len_a_B + len_b_B).max())
        ra, ca = a_mask.nonzero(as_tuple=True)  # real positions of a: (row, column)
        rb, cb = b_mask.nonzero(as_tuple=True)
        cb_out = len_a_B[rb] + cb  # b starts right after a's last real token
        for key, fill in self.fills.items():
            a_BL, b_BM = batch[f"{a}{key}"], batch.pop(f"{b}{key}")[:, skip:]
            out_BL = torch.full((B, L), fill, dtype=a_BL.dtype)
            out_BL[ra, ca], out_BL[rb, cb_out] = a_BL[ra, ca], b_BM[rb, cb]
            batch[f"{a}{key}"] = out_BL
        if not skip:  # b's [CLS] slot: the second separator
            head_N = cb == 0  # N: b's real tokens
            batch[f"{a}input_ids"][rb[head_N], cb_out[head_N]] = self.sep_id
        if self.segments == 2:
            batch[f"{a}segment_ids"][rb, cb_out] = 1
        pos_BL = torch.zeros(B, L, dtype=torch.long)
        pos_BL[ra, ca] = ca
        # restarted: b's columns as they were (with one separator, b's [CLS] keeps slot 0)
        pos_BL[rb, cb_out] = cb + skip if self.restart_positions else cb_out
        batch[f"{a}position_ids"] = pos_BL
        return batch

    def _stack(self, batch: Batch) -> Batch:
        views = [{k: batch.pop(f"{p}{k}") for k in self.fills} for p in (self.first, self.second)]
        L = max(v["input_ids"].shape[1] for v in views)
        for key, fill in self.fills.items():
            parts = [
                torch.nn.functional.pad(v[key], (0, L - v[key].shape[1]), value=fill) for v in views
            ]
            batch[f"{self.first}{key}"] = torch.cat(parts)
        batch[KEY] = list(batch[KEY]) * 2
        batch[PAIRS] = "stacked"
        return batch


@dataclass
class PackRows:
    """Packs a batch's text rows into fewer, longer rows (a transform, priority 18).

    For the sources named in ``pack`` (source → tokens per row; "" = batches of
    ``data.train``), each row's real tokens go, in row order, into the first packed row with
    room (first fit); ``visible_mask [R,P,P]`` lets each token see only the tokens of its
    own sample (and, where a row already had a visible matrix, e.g. K-BERT's, only those it
    allowed), and ``position_ids`` continue each sample's own positions. A fusion that
    honours visible matrices (``single_stream``) then gives every token the output it would
    have unpacked, without computing padding: short sentences padded to a batch's longest
    spend most of a step on padding otherwise. Every per-token key of the view travels
    along; runs after pair joining and K-BERT's tree (15, 16), before masking (20). The
    sample keys (``__key__``) stay one per sample: rows are no longer samples, so only
    token-level objectives (MLM, TLM) may train on packed batches.
    """

    data_priority: ClassVar[int] = 18

    pack: dict[str, int]
    #: key prefix of the text view
    prefix: str = ""
    #: per-token keys → padding value (``input_ids``: the pad id); other keys pad with 0
    fills: dict[str, int | bool] = field(default_factory=dict)

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        source = batch_source(batch)
        size = self.pack.get(source, 0)
        if not size:
            return batch
        p = self.prefix
        real_BL = batch[f"{p}attention_mask"]
        B, L = real_BL.shape
        len_B = real_BL.sum(1)
        if not torch.equal(real_BL, torch.arange(L)[None, :] < len_B[:, None]):
            raise ValueError("packing needs each row's real tokens first, then its padding")
        if int(len_B.max()) > size:
            where = f"data.sources.{source}.pack" if source else "data.pack"
            raise ValueError(
                f"{where}={size} is shorter than a row of {int(len_B.max())} tokens: raise it "
                "to at least data.modalities.text.max_len (twice that for joined pairs)"
            )
        per_token = [k for k, v in batch.items() if _is_rows(v, B) and v.shape[1:] == (L,)]
        vis = batch.get("visible_mask")
        other = [
            k for k, v in batch.items()
            if _is_rows(v, B) and k not in per_token and k != "visible_mask"
        ]  # fmt: skip
        if other or (vis is not None and vis.shape != (B, L, L)):
            raise ValueError(
                f"packing packs the rows of the text view alone; the batch also has per-row "
                f"{other or ['visible_mask']} (a source with pack must feed only the text)"
            )
        # first fit, in row order: row b goes to packed row bin_B[b] at column start_B[b]
        used: list[int] = []  # tokens taken in each packed row
        bin_B, start_B = torch.empty(B, dtype=torch.long), torch.empty(B, dtype=torch.long)
        for b, n in enumerate(len_B.tolist()):
            r = next((r for r, u in enumerate(used) if u + n <= size), len(used))
            if r == len(used):
                used.append(0)
            bin_B[b], start_B[b] = r, used[r]
            used[r] += n
        R, P = len(used), max(used)
        rows, cols = real_BL.nonzero(as_tuple=True)
        out_r, out_c = bin_B[rows], start_B[rows] + cols
        # where each packed slot came from (sample, column); -1 = padding
        sample_RP = torch.full((R, P), -1, dtype=torch.long)
        column_RP = torch.zeros(R, P, dtype=torch.long)
        sample_RP[out_r, out_c], column_RP[out_r, out_c] = rows, cols
        if f"{p}position_ids" not in batch:
            batch[f"{p}position_ids"] = torch.arange(L).expand(B, L)
            per_token.append(f"{p}position_ids")
        for key in per_token:
            v_BL = batch[key]
            fill = self.fills.get(key[len(p) :], 0) if key.startswith(p) else 0
            out = torch.full((R, P), fill, dtype=v_BL.dtype)
            out[out_r, out_c] = v_BL[rows, cols]
            batch[key] = out
        same_RPP = (sample_RP[:, :, None] == sample_RP[:, None, :]) & (sample_RP >= 0)[:, None, :]
        if vis is not None:
            src = sample_RP.clamp(min=0)
            same_RPP &= vis[src[:, :, None], column_RP[:, :, None], column_RP[:, None, :]]
        batch["visible_mask"] = same_RPP
        return batch


def _is_rows(v: Any, B: int) -> bool:
    return isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == B
