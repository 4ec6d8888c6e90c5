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

import torch
import torch.nn.functional as F

from mmptm.batch import move_to
from mmptm.data.decode import Collate
from mmptm.data.pipeline import SkipCounter, expand_shards, tar_samples
from mmptm.fusion.base import pool
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel


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
    tokenizer,
    texts: list[str],
    lang: str,
    max_len: int,
    batch_size: int = 128,
) -> torch.Tensor:
    """Mean-pooled sentence vectors [N,D], each sentence encoded on its own."""

    def lang_index(code: str) -> int:
        return tokenizer.lang_index(code) if code in tokenizer.languages else 0

    collate = Collate(tokenizer.pad_id, lang_index)
    out = []
    for s in range(0, len(texts), batch_size):
        samples = [
            {
                "__key__": str(i),
                "input_ids": tokenizer.build_inputs(tokenizer.encode(t), None, max_len)[0],
                "lang": lang,
            }
            for i, t in enumerate(texts[s : s + batch_size])
        ]
        batch = move_to(collate(samples), next(model.parameters()).device)
        batch.pop("__key__")
        fused = model.fuse(batch)
        out.append(pool(fused.hidden["text"], fused.mask["text"], "mean").float().cpu())
    return F.normalize(torch.cat(out), dim=-1)


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
    pairs = read_pairs(shards, pivot, max_per_language)
    result = {}
    for lang, pp in sorted(pairs.items()):
        src = embed(model, tokenizer, [p[1] for p in pp], lang, cfg.data.max_text_len)
        tgt = embed(model, tokenizer, [p[0] for p in pp], pivot, cfg.data.max_text_len)
        sim = src @ tgt.T
        gold = torch.arange(len(pp))
        x2p = (sim.argmax(1) == gold).float().mean().item()
        p2x = (sim.argmax(0) == gold).float().mean().item()
        result[lang] = (x2p + p2x) / 2
    result["avg"] = sum(result.values()) / len(result)
    return result
