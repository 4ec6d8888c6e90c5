"""Captioning and translation evaluation: a run writes text for a split's samples, scored
against the references (:mod:`mmptm.eval.generation`'s BLEU, chrF and CIDEr-D).

Captioning: each sample's conditioning views (an image's regions, a clip, a sound) in, one
caption out, scored against every caption of the sample in the language asked for (COCO's
protocol: all references of an image), beside the baseline that writes the training data's
most frequent caption for every sample. Translation: the parallel samples holding both
languages, in either order, the source side in, scored against the other side; beside the
model, the two baselines that learn nothing a model should not beat (copy the source, and a
word-by-word dictionary learned from the run's own training pairs).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

from mmptm.batch import KEY
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.eval.generation import caption_scores, translation_scores
from mmptm.eval.translation_baselines import baseline_scores
from mmptm.generate.decoding import DecodeConfig
from mmptm.generate.generator import Generator
from mmptm.modalities.base import Sample

#: example rows kept in a result (key, written text, first reference)
EXAMPLES = 5


def raw_samples(spec: str, limit: int | None = None) -> Iterator[tuple[Sample, dict]]:
    """(raw sample, its parsed json) from the shards of ``spec``; a sample whose json does not
    parse is skipped and counted (logged by the counter)."""
    handler = SkipCounter()
    n = 0
    for s in tar_samples(expand_shards(spec), handler):
        try:
            meta = json.loads(s["json"]) if "json" in s else {}
        except ValueError:
            handler.skip(s, "json does not parse")
            continue
        yield s, meta if isinstance(meta, dict) else {}
        n += 1
        if limit is not None and n >= limit:
            return


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _split_spec(gen: Generator, split: str, shards: str | None) -> str:
    spec = shards or getattr(gen.cfg.data, split, "")
    if not spec:
        raise ValueError(f"the run's config has no data.{split}: pass --shards")
    return spec


def evaluate_captioning(
    run: str | Generator,
    *,
    split: str = "test",
    shards: str | None = None,
    lang: str | None = None,
    decoding: DecodeConfig | None = None,
    limit: int | None = None,
    batch_size: int = 32,
    baselines: bool = True,
    overrides: Sequence[str] = (),
    device: str = "cpu",
) -> dict[str, Any]:
    """BLEU-4, chrF and CIDEr-D of the captions a run writes for ``split`` (or ``shards``) in
    ``lang`` (default: its first caption language), with a few examples; ``baselines``: also
    of writing the run's most frequent training caption for every sample."""
    gen = run if isinstance(run, Generator) else Generator.load(run, overrides, device)
    decoding = decoding or DecodeConfig()
    lang = lang or gen.default_language
    if lang is None:
        raise ValueError("the run names no language: pass --lang")
    text = gen.cfg.data.modalities.get("text")
    field = getattr(text, "captions_field", "captions")
    items = [
        (s, refs) for s, meta in raw_samples(_split_spec(gen, split, shards), limit)
        if (refs := _references(meta, field, lang))
    ]  # fmt: skip
    if not items:
        raise ValueError(f"no sample of {split!r} has {field}[{lang!r}]: nothing to score")
    start = time.perf_counter()
    hyps: list[str] = []
    for chunk in _chunks(items, batch_size):
        hyps += [g.text for g in gen.generate([s for s, _ in chunk], decoding, lang=lang)]
    refs = [r for _, r in items]
    result: dict[str, Any] = {"lang": lang, **caption_scores(hyps, refs)}
    result["seconds"] = round(time.perf_counter() - start, 2)
    result["decoding"] = asdict(decoding)
    if baselines and gen.cfg.data.train:
        common = most_frequent_caption(gen.cfg.data.train, field, lang)
        if common:
            result["baselines"] = {
                "most frequent caption": caption_scores([common] * len(refs), refs)
            }
    result["examples"] = [
        {"key": s[KEY], "written": h, "reference": r[0]}
        for (s, r), h in list(zip(items, hyps))[:EXAMPLES]
    ]
    return result


def most_frequent_caption(spec: str, field: str, lang: str, limit: int = 20000) -> str:
    """The caption in ``lang`` that the first ``limit`` samples of ``spec`` give most often
    (a captioner that learnt nothing of the picture can write it for every one)."""
    counts: Counter[str] = Counter()
    for _, meta in raw_samples(spec, limit):
        counts.update(_references(meta, field, lang))
    return counts.most_common(1)[0][0] if counts else ""


def _references(meta: dict, field: str, lang: str) -> list[str]:
    """A sample's captions in ``lang`` (a string or a list of them), else []."""
    value = (meta.get(field) or {}).get(lang) if isinstance(meta.get(field), dict) else None
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str) and v] if isinstance(value, list) else []


def parallel_pairs(spec: str, src: str, tgt: str, limit: int | None = None) -> list[tuple]:
    """(key, source text, target text) of the parallel samples holding both languages."""
    pairs = []
    for s, meta in raw_samples(spec):
        langs, texts = meta.get("languages"), meta.get("texts")
        if not (isinstance(langs, list) and isinstance(texts, list) and len(langs) == 2):
            continue
        by_lang = dict(zip(langs, texts))
        if src in by_lang and tgt in by_lang:
            pairs.append((s[KEY], by_lang[src], by_lang[tgt]))
            if limit is not None and len(pairs) >= limit:
                break
    return pairs


def text_sample(text: str, lang: str, key: str) -> Sample:
    """One sentence as a raw sample (the monolingual text format)."""
    return {KEY: key, "txt": text.encode("utf-8"), "json": json.dumps({"language": lang}).encode()}


def evaluate_translation(
    run: str | Generator,
    *,
    src: str,
    tgt: str,
    split: str = "test",
    shards: str | None = None,
    decoding: DecodeConfig | None = None,
    limit: int | None = None,
    batch_size: int = 32,
    baselines: bool = True,
    overrides: Sequence[str] = (),
    device: str = "cpu",
) -> dict[str, Any]:
    """BLEU and chrF of the run's ``src`` → ``tgt`` translations of ``split``'s parallel
    samples, and (``baselines``) of copying the source and of a word-by-word dictionary
    learned from the run's ``data.train`` pairs."""
    gen = run if isinstance(run, Generator) else Generator.load(run, overrides, device)
    decoding = decoding or DecodeConfig()
    pairs = parallel_pairs(_split_spec(gen, split, shards), src, tgt, limit)
    if not pairs:
        raise ValueError(f"no parallel sample of {split!r} holds both {src!r} and {tgt!r}")
    start = time.perf_counter()
    hyps: list[str] = []
    for chunk in _chunks(pairs, batch_size):
        samples = [text_sample(s, src, k) for k, s, _ in chunk]
        hyps += [g.text for g in gen.generate(samples, decoding, lang=tgt)]
    refs = [[t] for _, _, t in pairs]
    result: dict[str, Any] = {"src": src, "tgt": tgt, **translation_scores(hyps, refs, tgt)}
    result["seconds"] = round(time.perf_counter() - start, 2)
    result["decoding"] = asdict(decoding)
    if baselines and gen.cfg.data.train:
        train = [(s, t) for _, s, t in parallel_pairs(gen.cfg.data.train, src, tgt)]
        result["baselines"] = baseline_scores(train, [(s, t) for _, s, t in pairs], tgt)
    result["examples"] = [
        {"key": k, "source": s, "written": h, "reference": t}
        for (k, s, t), h in list(zip(pairs, hyps))[:EXAMPLES]
    ]
    return result


def format_scores(result: dict[str, Any]) -> str:
    """The scores (and baselines) as a small Markdown table, then the examples."""
    names = [k for k in ("bleu4", "bleu", "chrf", "cider_d") if k in result]
    rows = [("model", result), *result.get("baselines", {}).items()]
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    lines += [f"| {n} | " + " | ".join(f"{r[k]:.1f}" for k in names) + " |" for n, r in rows]
    for ex in result.get("examples", []):
        lines.append(f"  {ex['key']}: {ex['written']!r}  (reference: {ex['reference']!r})")
    return "\n".join(lines)
