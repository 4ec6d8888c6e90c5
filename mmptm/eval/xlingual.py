"""Cross-lingual sentence retrieval, Tatoeba protocol.

Each sentence is embedded alone (mean of the text hidden states over real tokens); for
every language X paired with the pivot, the nearest pivot sentence (cosine) of each X
sentence must be its translation, and vice versa. Accuracy per language.
Legend: N sentences per language, D width.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from mmptm.batch import move_to
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.fusion.base import pool
from mmptm.modalities.base import DataContext
from mmptm.modalities.text import TextData
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel
from mmptm.models.run import RunConfig


def read_pairs(shards: str, pivot: str, max_per_language: int) -> dict[str, list[tuple[str, str]]]:
    """(pivot sentence, translation) pairs per language from parallel-text shards."""
    pairs: dict[str, list[tuple[str, str]]] = defaultdict(list)
    handler = SkipCounter()
    for sample in tar_samples(expand_shards(shards), handler):
        meta = json.loads(sample["json"])
        langs, texts = meta["languages"], meta["texts"]
        if pivot not in langs:
            continue
        i = langs.index(pivot)
        other = langs[1 - i]
        if len(pairs[other]) < max_per_language:
            pairs[other].append((texts[i], texts[1 - i]))
    if not pairs:
        raise ValueError(f"{shards}: no parallel pairs with pivot language {pivot!r}")
    return dict(pairs)


@torch.no_grad()
def embed(
    model: PretrainModel,
    text: TextData,
    texts: list[str],
    lang: str,
    batch_size: int = 128,
) -> torch.Tensor:
    """Mean-pooled sentence vectors [N,D], each sentence encoded on its own."""
    out = []
    for s in range(0, len(texts), batch_size):
        batch = text.collate([text.encode(t, lang) for t in texts[s : s + batch_size]])
        fused = model.fuse(move_to(batch, next(model.parameters()).device))
        out.append(pool(fused.hidden["text"], fused.mask["text"], "mean").float().cpu())
    return F.normalize(torch.cat(out), dim=-1)


def text_plugin(cfg: RunConfig, tokenizer: Any) -> TextData:
    """The run's text plug-in (its ``data.modalities.text`` settings), one view."""
    settings = cfg.data.modalities.get("text") or TextData.Config()
    return TextData(settings, views=["text"], context=DataContext(tokenizer=tokenizer))


def evaluate_xlingual(
    path: str,
    shards: str,
    *,
    pivot: str = "en",
    max_per_language: int = 500,
    overrides: Sequence[str] = (),
) -> dict[str, float]:
    """Retrieval accuracy per language (both directions averaged) and their mean."""
    model, tokenizer, cfg = load_pretrained(path, overrides)
    text = text_plugin(cfg, tokenizer)
    pairs = read_pairs(shards, pivot, max_per_language)
    result = {}
    for lang, pp in sorted(pairs.items()):
        src = embed(model, text, [p[1] for p in pp], lang)
        tgt = embed(model, text, [p[0] for p in pp], pivot)
        sim = src @ tgt.T
        gold = torch.arange(len(pp))
        x2p = (sim.argmax(1) == gold).float().mean().item()
        p2x = (sim.argmax(0) == gold).float().mean().item()
        result[lang] = (x2p + p2x) / 2
    result["avg"] = sum(result.values()) / len(result)
    return result
