"""Parallel-sentence mining on BUCC 2018 as XTREME scores it (zero-shot, no fine-tuning).

Each sentence of both sides is embedded alone (:class:`~mmptm.eval.xlingual.SentenceEncoder`:
XTREME reads the mean of a middle layer's states), identical sentences once (LASER's
``unify``). Candidates are scored with the **ratio margin** of Artetxe & Schwenk (2019):

    score(x, y) = cos(x, y) / ((mean of x's k best cosines to Y + mean of y's k best to X) / 2)

with k = 4 (fewer when a side has fewer sentences). Mining as LASER's ``mine_bitexts.py``
with ``--retrieval max``: every source sentence proposes its best-scoring target among its k
nearest, every target its best source among its k nearest; the proposals are taken by
decreasing score, each sentence at most once, those scoring above 0 kept. A sentence pair
stands for every pair of ids that carry those texts.

The F1 is XTREME's ``bucc_eval``: on the dev split (BUCC's ``sample``) the threshold that
maximises F1 over the gold pairs (midway between the score that achieves it and the next
one down), then on the test split (XTREME: BUCC's ``training``, whose gold is public) the
pairs scoring at least that threshold against the gold: precision, recall, F1.
Legend: N source sentences, M target sentences, E embedding width, K neighbours.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.eval.xlingual import SentenceEncoder, SentenceVector
from mmptm.models.load import load_pretrained

#: neighbours of the margin (XTREME, LASER: 4)
K = 4


@dataclass
class BuccSet:
    """One language pair of one split: id → sentence per side, the gold (source id, target
    id) pairs (None: the split has no gold)."""

    languages: tuple[str, str]
    source: dict[str, str] = field(default_factory=dict)
    target: dict[str, str] = field(default_factory=dict)
    gold: set[tuple[str, str]] | None = None


def read_bucc(shards: str) -> dict[str, BuccSet]:
    """The BUCC sets of a shard spec (``mmptm data bucc``), keyed by source language."""
    sets: dict[str, BuccSet] = {}
    for sample in tar_samples(expand_shards(shards), SkipCounter()):
        try:
            meta = json.loads(sample["json"])
            ok = {"side", "pair", "id"} <= meta.keys() and "txt" in sample
        except (KeyError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise ValueError(f"{shards}: sample {sample['__key__']!r} is not BUCC's (txt, "
                             "json side / pair / id: write it with mmptm data bucc)")  # fmt: skip
        x, en = meta["pair"]
        s = sets.setdefault(x, BuccSet((x, en)))
        text = sample["txt"].decode("utf-8") if isinstance(sample["txt"], bytes) else sample["txt"]
        (s.source if meta["side"] == "source" else s.target)[meta["id"]] = text
        if "gold" in meta:
            s.gold = (s.gold or set()) | {(meta["id"], t) for t in meta["gold"]}
    if not sets:
        raise ValueError(f"{shards}: no BUCC sentences")
    return sets


def knn(
    x_NE: torch.Tensor, y_ME: torch.Tensor, k: int, block: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines [N,K] and indices [N,K] of each row's k nearest rows of ``y`` (normalised
    vectors), ``block`` rows of ``x`` at a time so that memory stays near block × M (BUCC's
    training split has 400k sentences a side: the whole N × M matrix would not fit); 0: as
    many rows as make 2^26 cosines."""
    k = min(k, len(y_ME))
    block = block or max(1, 2**26 // max(1, len(y_ME)))
    sims, inds = [], []
    for s in range(0, len(x_NE), block):
        sim_bM = x_NE[s : s + block] @ y_ME.T
        top = sim_bM.topk(k, dim=1)
        sims.append(top.values)
        inds.append(top.indices)
    return torch.cat(sims), torch.cat(inds)


def margin_scores(
    x_NE: torch.Tensor, y_ME: torch.Tensor, k: int = K, block: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ratio-margin scores of each sentence's k nearest on the other side (module doc):
    (forward scores [N,K], their target indices [N,K], backward scores [M,K], their source
    indices [M,K]); vectors L2-normalised; ``block``: as :func:`knn`."""
    fwd_NK, fwd_ind = knn(x_NE, y_ME, k, block)
    bwd_MK, bwd_ind = knn(y_ME, x_NE, k, block)
    fwd_mean_N, bwd_mean_M = fwd_NK.mean(1), bwd_MK.mean(1)
    fwd = fwd_NK / ((fwd_mean_N[:, None] + bwd_mean_M[fwd_ind]) / 2)
    bwd = bwd_MK / ((bwd_mean_M[:, None] + fwd_mean_N[bwd_ind]) / 2)
    return fwd, fwd_ind, bwd, bwd_ind


def mine(
    x_NE: torch.Tensor, y_ME: torch.Tensor, k: int = K, block: int = 0
) -> list[tuple[int, int, float]]:
    """(source index, target index, score) of the mined pairs, LASER's ``max`` retrieval
    (module doc), best first."""
    fwd, fwd_ind, bwd, bwd_ind = margin_scores(x_NE, y_ME, k, block)
    fwd_score, fwd_at = fwd.max(1)
    bwd_score, bwd_at = bwd.max(1)
    N, M = len(fwd), len(bwd)
    proposals = [(i, int(fwd_ind[i, fwd_at[i]]), float(fwd_score[i])) for i in range(N)]
    proposals += [(int(bwd_ind[j, bwd_at[j]]), j, float(bwd_score[j])) for j in range(M)]
    order = sorted(range(len(proposals)), key=lambda p: -proposals[p][2])  # stable on ties
    seen_src, seen_tgt, out = set(), set(), []
    for p in order:
        i, j, score = proposals[p]
        if i in seen_src or j in seen_tgt:
            continue
        seen_src.add(i)
        seen_tgt.add(j)
        if score > 0:
            out.append((i, j, score))
    return out


def best_threshold(candidates: Mapping[tuple[str, str], float], gold: set) -> float:
    """XTREME's ``bucc_optimize``: the threshold of the best F1 over ``candidates`` (id pair →
    score), midway between the score reaching it and the next lower one."""
    items = sorted(candidates.items(), key=lambda c: -c[1])
    extracted = correct = 0
    best_f1, threshold = 0.0, 0.0
    for n, (pair, score) in enumerate(items):
        extracted += 1
        correct += pair in gold
        if correct == 0:
            continue
        p, r = correct / extracted, correct / len(gold)
        f1 = 2 * p * r / (p + r)
        if f1 > best_f1:
            best_f1 = f1
            following = items[n + 1][1] if n + 1 < len(items) else score
            threshold = (score + following) / 2
    return threshold


def prf(candidates: Mapping[tuple[str, str], float], gold: set, threshold: float) -> dict:
    """Precision, recall and F1 (fractions) of the candidates scoring at least ``threshold``."""
    extracted = {pair for pair, score in candidates.items() if score >= threshold}
    correct = len(extracted & gold)
    if correct == 0:
        return {"p": 0.0, "r": 0.0, "f1": 0.0}
    p, r = correct / len(extracted), correct / len(gold)
    return {"p": p, "r": r, "f1": 2 * p * r / (p + r)}


def candidates(encode: SentenceEncoder, s: BuccSet, k: int = K) -> dict[tuple[str, str], float]:
    """(source id, target id) → margin score of the pairs mined from a BUCC set."""
    sides = []
    for sentences, lang, role in ((s.source, s.languages[0], "other"),
                                  (s.target, s.languages[1], "pivot")):  # fmt: skip
        ids_of: dict[str, list[str]] = defaultdict(list)
        for sid, text in sentences.items():
            ids_of[text].append(sid)
        texts = list(ids_of)
        sides.append((texts, ids_of, encode(texts, lang, role)))
    (src_texts, src_ids, x_NE), (tgt_texts, tgt_ids, y_ME) = sides
    out = {}
    for i, j, score in mine(x_NE, y_ME, k):
        for a in src_ids[src_texts[i]]:
            for b in tgt_ids[tgt_texts[j]]:
                out[a, b] = score
    return out


def evaluate_bucc(
    path: str,
    dev: str,
    test: str | None = None,
    *,
    pooling: str = "mean",
    layer: int | None = None,
    k: int = K,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """BUCC F1 per language pair: threshold from ``dev``, scored on ``test`` (module doc);
    without ``test``, dev's own best F1. ``{"vector", "sets": {lang: {"f1", "p", "r",
    "threshold", "dev_f1", "gold"}}, "avg": {"f1", "p", "r"}}``."""
    if k < 1:
        raise ValueError(f"--k {k}: the margin needs at least one neighbour")
    model, tokenizer, cfg = load_pretrained(path, overrides)
    vector = SentenceVector.resolve(model, pooling, layer)
    encode = SentenceEncoder(model, cfg, tokenizer, vector)
    dev_sets = read_bucc(dev)
    test_sets = read_bucc(test) if test else dev_sets
    per_lang = {}
    for lang, dev_set in sorted(dev_sets.items()):
        if lang not in test_sets:
            continue
        test_set = test_sets[lang]
        for name, s in (("dev", dev_set), ("test", test_set)):
            if not s.gold:
                raise ValueError(f"{dev if name == 'dev' else test}: the {lang}-"
                                 f"{s.languages[1]} {name} set has no gold pairs")  # fmt: skip
        dev_cands = candidates(encode, dev_set, k)
        threshold = best_threshold(dev_cands, dev_set.gold)
        test_cands = dev_cands if test_set is dev_set else candidates(encode, test_set, k)
        scores = prf(test_cands, test_set.gold, threshold)
        per_lang[lang] = {**scores, "threshold": threshold, "gold": len(test_set.gold),
                          "dev_f1": prf(dev_cands, dev_set.gold, threshold)["f1"]}  # fmt: skip
    if not per_lang:
        raise ValueError(f"{dev} and {test}: no language pair in both")
    avg = {m: sum(r[m] for r in per_lang.values()) / len(per_lang) for m in ("f1", "p", "r")}
    return {"vector": vector.describe(model, encode.layers), "sets": per_lang, "avg": avg}


def format_bucc(result: Mapping[str, Any]) -> str:
    """A table: F1, precision and recall per language pair and their average."""
    names = [*result["sets"], "avg"]
    lines = [f"{'':<10}" + "".join(f"{n:>9}" for n in names)]
    for m in ("f1", "p", "r"):
        cells = [result["sets"][n][m] for n in result["sets"]] + [result["avg"][m]]
        lines.append(f"{m:<10}" + "".join(f"{100 * v:>8.1f}%" for v in cells))
    lines.append(f"{'threshold':<10}" + "".join(f"{result['sets'][n]['threshold']:>9.4f}"
                                                for n in result["sets"]))  # fmt: skip
    return "\n".join(lines)


__all__ = [
    "BuccSet",
    "K",
    "best_threshold",
    "candidates",
    "evaluate_bucc",
    "format_bucc",
    "knn",
    "margin_scores",
    "mine",
    "prf",
    "read_bucc",
]
