"""Per-sample decoding and batch assembly: images, text views, labels.

A sample gives one or two **text views** depending on its format (read from its ``json``):

    image-text (img2dataset, toyworld)   json.captions[lang] or txt   → text
    monolingual text                     txt + json.language          → text
    parallel pair                        json.languages + json.texts  → text, text2
    NLI pair                             json.premise/hypothesis/label → text, text2, labels
    VQA question                         json.question (+ answers)     → text, answers

Region features come from a ``regions.npz`` member (features, boxes, image_size, optional
probs and labels) → ``region_feats``, ``region_boxes``, ``region_mask``, ``region_probs``,
``region_labels``; on-the-fly RoI encoders read the boxes alone (plus the image).

The first view fills ``input_ids``/``lang_ids``..., the second ``text2_input_ids``.... Models
with a ``text2`` encoder (text↔text contrastive) read the views apart; all others get them
concatenated into one sequence by :class:`ConcatPair` (XLM's TLM layout, BERT's pair layout),
or, for sources with ``pairs: stack``, stacked as separate rows (sentence-level contrastive).
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image

from mmptm.batch import batch_source

Sample = dict[str, Any]
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
VIEW_PREFIXES = ("", "text2_")
TEXT_KEYS = ("input_ids", "attention_mask", "segment_ids", "lang_ids")
NLI_LABELS = ("entailment", "neutral", "contradiction")


def text_views(
    sample: Sample, meta: dict, caption_languages: Sequence[str], rng: random.Random
) -> list[tuple[str, str]]:
    """The (text, language) segments of a sample, by its format (see the module docstring)."""
    if "question" in meta:
        return [(meta["question"], meta.get("language", "en"))]
    if "premise" in meta and "hypothesis" in meta:
        lang = meta.get("language", "")
        return [(meta["premise"], lang), (meta["hypothesis"], lang)]
    if "texts" in meta:
        texts, langs = meta["texts"], meta.get("languages") or ["", ""]
        if len(texts) != 2 or len(langs) != 2:
            raise ValueError(f"a parallel pair needs 2 texts and 2 languages, got {len(texts)}")
        views = list(zip(texts, langs))
        if rng.random() < 0.5:  # both directions, as XLM's TLM
            views.reverse()
        return views
    captions = meta.get("captions") or {}
    langs = [lang for lang in caption_languages if captions.get(lang)]
    if langs:
        lang = rng.choice(langs)
        return [(captions[lang], lang)]
    if "txt" in sample:
        lang = meta.get("language") or (caption_languages[0] if caption_languages else "")
        return [(sample["txt"].decode("utf-8"), lang)]
    raise ValueError(f"no text: no caption in {list(caption_languages)}, no pair, no txt member")


@dataclass
class Decoder:
    """Decodes a raw sample into the tensors its modalities need; raises ValueError if it can't.

    ``needs`` names what the model reads (``image``, ``text``, ``text2``); a sample lacking
    one of them is bad input. Random choices (caption language, pair order) are drawn per
    (seed, epoch, sample key), so they do not depend on worker count or resume.
    """

    tokenizer: Any
    needs: frozenset[str]
    image_size: int
    image_mean: Sequence[float]
    image_std: Sequence[float]
    max_text_len: int
    caption_languages: Sequence[str]
    seed: int = 0
    epoch: int = 0

    def __call__(self, sample: Sample) -> Sample:
        out: Sample = {"__key__": sample["__key__"]}
        meta = json.loads(sample["json"]) if "json" in sample else {}
        if not isinstance(meta, dict):
            raise ValueError(f"json member is a {type(meta).__name__}, expected an object")
        if "image" in self.needs:
            out["pixels"] = self.image(sample)
        if "text" in self.needs:
            rng = random.Random(f"{self.seed}/{self.epoch}/{sample['__key__']}")
            views = text_views(sample, meta, self.caption_languages, rng)
            if "text2" in self.needs and len(views) < 2:
                raise ValueError("the model reads a second text view (text2); sample has one")
            for prefix, (text, lang) in zip(VIEW_PREFIXES, views):
                ids, _ = self.tokenizer.build_inputs(
                    self.tokenizer.encode(text), None, self.max_text_len
                )
                out[f"{prefix}input_ids"], out[f"{prefix}lang"] = ids, lang
        if "regions" in self.needs or "roi" in self.needs:
            out.update(self.regions(sample))
        if meta.get("answers"):  # raw; the VQA objective's data side scores them
            out["answers"] = [str(a) for a in meta["answers"]]
        if "question_id" in meta:
            out["question_id"] = int(meta["question_id"])
        if "answer_type" in meta:  # VQA v2's yes/no | number | other, for per-type accuracy
            out["answer_type"] = str(meta["answer_type"])
        if "label" in meta:
            if meta["label"] not in NLI_LABELS:
                raise ValueError(f"label {meta['label']!r} is not one of {NLI_LABELS}")
            out["labels"] = NLI_LABELS.index(meta["label"])
        return out

    def regions(self, sample: Sample) -> Sample:
        if "regions.npz" not in sample:
            raise ValueError(f"no regions.npz member; has {sorted(sample)}")
        with np.load(io.BytesIO(sample["regions.npz"])) as z:
            arrays = {k: z[k] for k in z.files}
        for key in ("features", "boxes"):
            if key not in arrays:
                raise ValueError(f"regions.npz lacks {key!r} (has {sorted(arrays)})")
        feats, boxes = arrays["features"], arrays["boxes"]
        if feats.ndim != 2 or boxes.shape != (feats.shape[0], 4):
            raise ValueError(f"regions.npz: features {feats.shape} / boxes {boxes.shape} mismatch")
        out = {
            "region_feats": torch.from_numpy(feats.astype(np.float32)),
            "region_boxes": torch.from_numpy(boxes.astype(np.float32)),
        }
        if "probs" in arrays:
            out["region_probs"] = torch.from_numpy(arrays["probs"].astype(np.float32))
        if "labels" in arrays:
            out["region_labels"] = torch.from_numpy(arrays["labels"].astype(np.int64))
        return out

    def image(self, sample: Sample) -> torch.Tensor:
        ext = next((e for e in IMAGE_EXTS if e in sample), None)
        if ext is None:
            raise ValueError(f"no image member (one of {IMAGE_EXTS}); has {sorted(sample)}")
        with Image.open(io.BytesIO(sample[ext])) as img:
            img.load()  # decode now, so a truncated file fails here
            img = img.convert("RGB")
            if img.size != (self.image_size, self.image_size):
                img = img.resize((self.image_size, self.image_size), Image.BICUBIC)
            x_HWC = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x_CHW = x_HWC.view(self.image_size, self.image_size, 3).permute(2, 0, 1).float() / 255.0
        mean = torch.tensor(self.image_mean).view(3, 1, 1)
        std = torch.tensor(self.image_std).view(3, 1, 1)
        return (x_CHW - mean) / std


@dataclass
class Collate:
    """Stacks decoded samples; each text view is padded to its longest in the batch."""

    pad_id: int
    lang_index: Callable[[str], int]

    def __call__(self, samples: list[Sample]) -> dict[str, Any]:
        batch: dict[str, Any] = {"__key__": [s["__key__"] for s in samples]}
        if "pixels" in samples[0]:
            batch["pixels"] = torch.stack([s["pixels"] for s in samples])
        if "labels" in samples[0]:
            batch["labels"] = torch.tensor([s["labels"] for s in samples])
        if "answers" in samples[0]:
            batch["answers"] = [s.get("answers", []) for s in samples]
        if "question_id" in samples[0]:
            batch["question_id"] = torch.tensor([s["question_id"] for s in samples])
        if "answer_type" in samples[0]:
            batch["answer_type"] = [s.get("answer_type", "") for s in samples]
        if "region_boxes" in samples[0]:
            batch.update(pad_regions(samples))
        for p in VIEW_PREFIXES:
            if f"{p}input_ids" not in samples[0]:
                continue
            lengths = [len(s[f"{p}input_ids"]) for s in samples]
            L = max(lengths)
            ids_BL = torch.full((len(samples), L), self.pad_id, dtype=torch.long)
            for i, s in enumerate(samples):
                ids_BL[i, : lengths[i]] = torch.tensor(s[f"{p}input_ids"], dtype=torch.long)
            batch[f"{p}input_ids"] = ids_BL
            batch[f"{p}attention_mask"] = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
            batch[f"{p}segment_ids"] = torch.zeros_like(ids_BL)
            lang_B = torch.tensor([self.lang_index(s[f"{p}lang"]) for s in samples])
            batch[f"{p}lang_ids"] = lang_B[:, None].expand(-1, L).contiguous()
        return batch


def pad_regions(samples: list[Sample]) -> dict[str, torch.Tensor]:
    """Region tensors padded to the most regions in the batch, with ``region_mask``."""
    counts = [len(s["region_boxes"]) for s in samples]
    B, R = len(samples), max(counts)
    out = {"region_mask": torch.arange(R)[None, :] < torch.tensor(counts)[:, None]}
    fills = {"region_feats": 0.0, "region_boxes": 0.0, "region_probs": 0.0, "region_labels": -1}
    for key, fill in fills.items():
        if key not in samples[0]:
            continue
        first = samples[0][key]
        t = torch.full((B, R, *first.shape[1:]), fill, dtype=first.dtype)
        for i, s in enumerate(samples):
            t[i, : counts[i]] = s[key]
        out[key] = t
    return out


@dataclass
class ConcatPair:
    """Joins the two text views into ``[CLS] a [SEP] b [SEP]`` (the second view's [CLS] dropped).

    Segment ids are 0 / 1, language ids stay per token, and with ``restart_positions`` the
    second sentence's positions start again at 0 (XLM's TLM); otherwise they continue (BERT).
    Runs after negative sampling (which swaps whole ``text2_*`` rows) and before masking.

    Batches of the sources named in ``stack`` get the views as separate rows instead: rows
    0..B-1 hold the first sentences, rows B..2B-1 their translations (each ``[CLS] x [SEP]``,
    encoded alone), and ``__pairs__`` is set to ``"stacked"``: what a contrastive objective
    over ``[text, text]`` aligns (InfoXLM's cross-lingual contrast, LaBSE).
    """

    data_priority: ClassVar[int] = 15

    pad_id: int
    restart_positions: bool = True
    #: source names (``data.sources`` keys) whose pairs are stacked rather than joined
    stack: frozenset[str] = frozenset()

    def __call__(self, batch: dict[str, Any], g: torch.Generator) -> dict[str, Any]:
        if "text2_input_ids" not in batch:
            return batch
        if batch_source(batch) in self.stack:
            return stack_pair(batch, self.pad_id)
        a_BL, b_BM = batch["input_ids"], batch.pop("text2_input_ids")[:, 1:]
        a_mask, b_mask = batch["attention_mask"], batch.pop("text2_attention_mask")[:, 1:]
        a_lang, b_lang = batch["lang_ids"], batch.pop("text2_lang_ids")[:, 1:]
        batch.pop("text2_segment_ids", None)
        len_a_B, len_b_B = a_mask.sum(1), b_mask.sum(1)
        B, L = a_BL.shape[0], int((len_a_B + len_b_B).max())
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        pos, seg, lang = torch.zeros_like(ids), torch.zeros_like(ids), torch.zeros_like(ids)
        ra, ca = a_mask.nonzero(as_tuple=True)  # real positions of a: (row, column)
        rb, cb = b_mask.nonzero(as_tuple=True)
        cb_out = len_a_B[rb] + cb  # b starts right after a's last real token
        ids[ra, ca], ids[rb, cb_out] = a_BL[ra, ca], b_BM[rb, cb]
        lang[ra, ca], lang[rb, cb_out] = a_lang[ra, ca], b_lang[rb, cb]
        seg[rb, cb_out] = 1
        pos[ra, ca] = ca
        pos[rb, cb_out] = cb + 1 if self.restart_positions else cb_out  # +1: b's [CLS] slot
        batch.update(
            input_ids=ids,
            attention_mask=torch.arange(L)[None, :] < (len_a_B + len_b_B)[:, None],
            position_ids=pos,
            segment_ids=seg,
            lang_ids=lang,
        )
        return batch


def stack_pair(batch: dict[str, Any], pad_id: int) -> dict[str, Any]:
    """The two text views as 2B rows of one ``text`` view (see :class:`ConcatPair`)."""
    views = [{k: batch.pop(f"{p}{k}") for k in TEXT_KEYS} for p in VIEW_PREFIXES]
    L = max(v["input_ids"].shape[1] for v in views)
    for key in TEXT_KEYS:
        fill = pad_id if key == "input_ids" else 0
        parts = [
            torch.nn.functional.pad(v[key], (0, L - v[key].shape[1]), value=fill) for v in views
        ]
        batch[key] = torch.cat(parts)
    batch["__key__"] = list(batch["__key__"]) * 2
    batch["__pairs__"] = "stacked"
    return batch
