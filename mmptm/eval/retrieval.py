"""Image↔text retrieval: R@1/5/10 in both directions over the pairs of a split.

Sample i's image and caption are the ground-truth pair. Dual encoders score by the dot
product of the contrastive embeddings; fusion models without one score every pair with
the ITM head (quadratic, so capped by ``max_items``).
Legend: I images, T texts (I == T == N here), E embedding width.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from mmptm.data.pipeline import move_to, single_pass, stream_config
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.contrastive import Contrastive
from mmptm.objectives.itm import ImageTextMatching
from mmptm.train.trainer import load_pretrained, modality_kinds

KS = (1, 5, 10)


def recall_at_k(sim_IT: torch.Tensor, ks: Iterable[int] = KS) -> dict[str, float]:
    """Recall@k for a square similarity matrix whose diagonal holds the true pairs.

    A rank is the number of candidates scoring strictly higher than the true one.
    """
    if sim_IT.ndim != 2 or sim_IT.shape[0] != sim_IT.shape[1]:
        raise ValueError(f"expected a square similarity matrix, got {tuple(sim_IT.shape)}")
    true_I = sim_IT.diagonal()
    rank_i2t = (sim_IT > true_I[:, None]).sum(1)  # per image, over texts
    rank_t2i = (sim_IT > true_I[None, :]).sum(0)  # per text, over images
    out = {}
    for k in ks:
        out[f"i2t_R@{k}"] = (rank_i2t < k).float().mean().item()
        out[f"t2i_R@{k}"] = (rank_t2i < k).float().mean().item()
    return out


def _collect(batches: Iterable[dict[str, Any]], max_items: int) -> dict[str, Any]:
    """Concatenate eval batches (text padded to the longest overall) up to max_items."""
    parts: list[dict[str, Any]] = []
    n = 0
    for b in batches:
        if "__end__" in b:
            continue
        parts.append(b)
        n += len(b["__key__"])
        if n >= max_items:
            break
    if not parts:
        raise ValueError("the evaluation split produced no samples")
    L = max(p["input_ids"].shape[1] for p in parts)
    keys = [k for p in parts for k in p["__key__"]]
    out: dict[str, Any] = {"__key__": keys[:max_items]}
    for key in ("pixels", "input_ids", "attention_mask", "segment_ids", "lang_ids"):
        if key not in parts[0]:
            continue
        tensors = []
        for p in parts:
            t = p[key]
            if t.ndim == 2 and key != "pixels":  # pad text-shaped tensors to L
                t = torch.nn.functional.pad(t, (0, L - t.shape[1]))
            tensors.append(t)
        out[key] = torch.cat(tensors)[:max_items]
    return out


@torch.no_grad()
def similarity(
    model: PretrainModel, data: dict[str, Any], device: torch.device, batch_size: int = 128
) -> torch.Tensor:
    """Image×text score matrix [N,N] from the model's contrastive or ITM head."""
    text_keys = ["input_ids", "attention_mask", "segment_ids", "lang_ids"]
    contrastive = [o for o in model.objectives.values() if isinstance(o, Contrastive)]
    if contrastive:
        head = contrastive[0]
        n = len(data["__key__"])
        img, txt = [], []
        for s in range(0, n, batch_size):
            chunk = {k: v[s : s + batch_size] for k, v in data.items() if k != "__key__"}
            chunk = move_to(chunk, device)
            img.append(head.embed(model.fuse({"pixels": chunk["pixels"]}), "image"))
            text_only = {k: chunk[k] for k in text_keys if k in chunk}
            txt.append(head.embed(model.fuse(text_only), "text"))
        return (torch.cat(img) @ torch.cat(txt).T).cpu()
    itm = [o for o in model.objectives.values() if isinstance(o, ImageTextMatching)]
    if not itm:
        raise ValueError("retrieval needs a contrastive or an itm objective in the model")
    n = len(data["__key__"])
    sim = torch.empty(n, n)
    texts = move_to({k: data[k] for k in text_keys if k in data}, device)
    for i in range(n):  # image i against every text, in chunks
        for s in range(0, n, batch_size):
            chunk = {k: v[s : s + batch_size] for k, v in texts.items()}
            m = chunk["input_ids"].shape[0]
            pixels = data["pixels"][i : i + 1].to(device).expand(m, -1, -1, -1)
            sim[i, s : s + m] = itm[0].score(model.fuse({**chunk, "pixels": pixels})).cpu()
    return sim


def evaluate_retrieval(
    path: str,
    *,
    split: str = "test",
    shards: str | None = None,
    language: str | None = None,
    max_items: int = 1000,
    batch_size: int = 128,
    overrides: Sequence[str] = (),
    device: str = "cpu",
) -> dict[str, float]:
    """R@1/5/10 (both directions) of a checkpoint on ``split`` (or explicit ``shards``)."""
    model, tokenizer, cfg = load_pretrained(path, overrides)
    dev = torch.device(device)
    model.to(dev)
    data_cfg = cfg.data
    if language is not None:
        data_cfg.caption_languages = [language]
    else:
        data_cfg.caption_languages = data_cfg.caption_languages[:1]
    stream = stream_config(
        data_cfg, tokenizer, split=split, needs=modality_kinds(model), shards=shards, seed=cfg.seed
    )
    stream.batch_size = batch_size
    data = _collect(single_pass(stream), max_items)
    sim = similarity(model, data, dev, batch_size)
    n = sim.shape[0]
    result = {"n": float(n), **recall_at_k(sim)}
    result.update({f"chance_R@{k}": min(k / n, 1.0) for k in KS})
    return result


def format_table(rows: dict[str, dict[str, float]]) -> str:
    """A plain-text table: one row per named result, columns R@1/5/10 both ways + chance."""
    cols = [f"{d}_R@{k}" for d in ("i2t", "t2i") for k in KS] + ["chance_R@1"]
    head = f"{'':<14}" + "".join(f"{c:>12}" for c in cols)
    lines = [head]
    for name, r in rows.items():
        lines.append(f"{name:<14}" + "".join(f"{100 * r[c]:>11.1f}%" for c in cols))
    return "\n".join(lines)
