"""Image↔text retrieval: R@1/5/10 in both directions over the pairs of a split.

Sample i's image and caption are the ground-truth pair. Dual encoders score by the dot
product of the contrastive embeddings; models with both heads re-rank the top-k of that
first stage with ITM; fusion models with ITM alone score every pair (quadratic, so capped
by ``max_items``). The image side is pixels and/or region features.
Legend: I images, T texts (I == T == N here), E embedding width.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from mmptm.batch import move_to
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.models.load import load_pretrained, modality_kinds
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.contrastive import Contrastive
from mmptm.objectives.itm import ImageTextMatching

KS = (1, 5, 10)
TEXT_KEYS = ("input_ids", "attention_mask", "segment_ids", "lang_ids", "position_ids")
IMAGE_KEYS = (
    "pixels", "region_feats", "region_boxes", "region_mask", "region_probs", "region_labels",
)  # fmt: skip


def recall_at_k(
    sim_IT: torch.Tensor, ks: Iterable[int] = KS, sim_t2i_IT: torch.Tensor | None = None
) -> dict[str, float]:
    """Recall@k for square similarity matrices whose diagonal holds the true pairs.

    A rank is the number of candidates scoring strictly higher than the true one.
    ``sim_t2i_IT`` scores the text→image direction when it differs (ITM re-ranking).
    """
    t2i_IT = sim_IT if sim_t2i_IT is None else sim_t2i_IT
    for m in (sim_IT, t2i_IT):
        if m.ndim != 2 or m.shape[0] != m.shape[1]:
            raise ValueError(f"expected a square similarity matrix, got {tuple(m.shape)}")
    rank_i2t = (sim_IT > sim_IT.diagonal()[:, None]).sum(1)  # per image, over texts
    rank_t2i = (t2i_IT > t2i_IT.diagonal()[None, :]).sum(0)  # per text, over images
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
    R = max((p["region_mask"].shape[1] for p in parts if "region_mask" in p), default=0)
    for key in (*IMAGE_KEYS, *TEXT_KEYS):
        if key not in parts[0]:
            continue
        tensors = []
        for p in parts:
            t = p[key]
            if key in TEXT_KEYS:  # pad text to the longest overall
                t = torch.nn.functional.pad(t, (0, L - t.shape[1]))
            elif key.startswith("region_"):  # pad regions along R (labels with -1)
                pad = [0, 0] * (t.ndim - 2) + [0, R - t.shape[1]]
                t = torch.nn.functional.pad(t, pad, value=-1 if key == "region_labels" else 0)
            tensors.append(t)
        out[key] = torch.cat(tensors)[:max_items]
    return out


def _side(data: dict[str, Any], keys: Sequence[str], idx: torch.Tensor) -> dict[str, Any]:
    return {k: data[k][idx] for k in keys if k in data}


@torch.no_grad()
def itm_scores(
    head: ImageTextMatching,
    model: PretrainModel,
    data: dict[str, Any],
    img_P: torch.Tensor,
    txt_P: torch.Tensor,
    device: torch.device,
    batch_size: int,
) -> torch.Tensor:
    """ITM scores [P] of the pairs (image img_P[p], text txt_P[p])."""
    out = []
    for s in range(0, len(img_P), batch_size):
        pair = {
            **_side(data, IMAGE_KEYS, img_P[s : s + batch_size]),
            **_side(data, TEXT_KEYS, txt_P[s : s + batch_size]),
        }
        out.append(head.score(model.fuse(move_to(pair, device))).cpu())
    return torch.cat(out)


@torch.no_grad()
def similarity(
    model: PretrainModel,
    data: dict[str, Any],
    device: torch.device,
    batch_size: int = 128,
    rerank_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Image×text scores [N,N] for image→text and for text→image retrieval.

    Dual encoders: the dot product of the contrastive embeddings (both directions alike).
    With an ITM head and ``rerank_k``: the top-k of that cheap first stage, per query, are
    re-scored by ITM (ALBEF / UNITER style) and ranked above the rest. Without a contrastive
    head: ITM scores every pair (quadratic).
    """
    n = len(data["__key__"])
    heads = model.objectives.values()
    contrastive = next((o for o in heads if isinstance(o, Contrastive)), None)
    itm = next((o for o in heads if isinstance(o, ImageTextMatching)), None)
    if contrastive is None and itm is None:
        raise ValueError("retrieval needs a contrastive or an itm objective in the model")
    if contrastive is None:
        img_P = torch.arange(n).repeat_interleave(n)
        txt_P = torch.arange(n).repeat(n)
        full = itm_scores(itm, model, data, img_P, txt_P, device, batch_size).view(n, n)
        return full, full
    img, txt = [], []
    for s in range(0, n, batch_size):
        idx = torch.arange(s, min(s + batch_size, n))
        for keys, dest in ((IMAGE_KEYS, img), (TEXT_KEYS, txt)):
            out = model.fuse(move_to(_side(data, keys, idx), device))
            (side,) = [m for m in contrastive.cfg.modalities if m in out.hidden]
            dest.append(contrastive.embed(out, side))
    first = (torch.cat(img) @ torch.cat(txt).T).cpu()
    if itm is None or rerank_k <= 0:
        return first, first
    k = min(rerank_k, n)
    reranked = []
    for top_QK, per_image in (
        (first.topk(k, dim=1).indices, True),
        (first.T.topk(k, dim=1).indices, False),
    ):
        q_P = torch.arange(n).repeat_interleave(k)
        c_P = top_QK.flatten()
        img_P, txt_P = (q_P, c_P) if per_image else (c_P, q_P)
        scores = itm_scores(itm, model, data, img_P, txt_P, device, batch_size)
        sim = first.clone()
        lift = first.max() - scores.min() + 1.0  # re-ranked candidates stay above the rest
        sim[img_P, txt_P] = scores + lift
        reranked.append(sim)
    return reranked[0], reranked[1]


def evaluate_retrieval(
    path: str,
    *,
    split: str = "test",
    shards: str | None = None,
    language: str | None = None,
    max_items: int = 1000,
    batch_size: int = 128,
    rerank_k: int = 0,
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
    sim_i2t, sim_t2i = similarity(model, data, dev, batch_size, rerank_k)
    n = sim_i2t.shape[0]
    result = {"n": float(n), **recall_at_k(sim_i2t, sim_t2i_IT=sim_t2i)}
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
