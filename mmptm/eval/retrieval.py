"""Image↔text retrieval: R@1/5/10 in both directions over the pairs of a split.

Sample i's item (image, regions, or any modality an encoder reads) and caption are the
ground-truth pair. The two sides come from the model: a contrastive head's two modalities,
or, for a fusion model with ITM alone, the encoders whose inputs ITM swaps (the items)
against the rest (the queries); when ITM swaps a second text segment (Oscar's object tags),
the items are the tags with the regions, and every pair is packed as training packs it.
Dual encoders score by the dot product of the contrastive embeddings; models with both heads
re-rank the top-k of that first stage with ITM; fusion models with ITM alone score every
pair (quadratic, so capped by ``max_items``).
Legend: I items, T texts (I == T == N here), E embedding width.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from mmptm.batch import END, KEY, BatchTransform, move_to
from mmptm.data.pipeline import StreamConfig, single_pass, stream_config
from mmptm.modalities.text import TextData
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.contrastive import Contrastive
from mmptm.objectives.itm import ImageTextMatching, SwapNegatives

KS = (1, 5, 10)


@dataclass(frozen=True)
class Sides:
    """What retrieval ranks: items against queries, and the batch keys of each side."""

    item_keys: tuple[str, ...]
    query_keys: tuple[str, ...]
    #: the contrastive head's names of the two sides ("" without a contrastive head)
    items: str = ""
    queries: str = ""
    #: batch stages run on every formed pair: the ones training runs after ITM swapped its
    #: negatives, when the swapped keys are joined into another view (Oscar's object tags,
    #: packed after the caption); empty: the batch's rows pair as they are
    pair_stages: tuple[BatchTransform, ...] = ()

    def pair(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``batch`` (one item's and one query's keys per row) made ready for the model."""
        return run_stages(self.pair_stages, batch)


def run_stages(stages: Sequence[BatchTransform], batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` through evaluation batch stages (deterministic: a fixed generator)."""
    g = torch.Generator().manual_seed(0)
    for stage in stages:
        batch = stage(batch, g)
    return batch


def retrieval_heads(model: PretrainModel) -> tuple[Contrastive | None, ImageTextMatching | None]:
    """The model's first contrastive and first ITM head; at least one must exist."""
    heads = model.objectives.values()
    contrastive = next((o for o in heads if isinstance(o, Contrastive)), None)
    itm = next((o for o in heads if isinstance(o, ImageTextMatching)), None)
    if contrastive is None and itm is None:
        raise ValueError("retrieval needs a contrastive or an itm objective in the model")
    return contrastive, itm


def objective_types(model: PretrainModel) -> str:
    """``name (type), ...`` of the model's objectives, for error messages."""
    return ", ".join(f"{n} ({c.type})" for n, c in model.cfg.objectives.items()) or "none"


def retrieval_sides(
    model: PretrainModel,
    stream: StreamConfig,
    batch: Sequence[str] = (),
    late: Sequence[BatchTransform] = (),
) -> Sides:
    """The item and query sides of ``model``, with the keys ``stream`` gives each.

    ITM alone: the encoders whose inputs it swaps are the items, the rest the queries. When
    it swaps keys that no encoder reads as such, a second view that a ``late`` stage joins
    into another (Oscar's tags into the caption's sequence; ``batch``: the keys before that
    stage), the text encoders' inputs are the queries, the swapped keys with every other
    encoder's the items, and pairs go through ``late`` as training's negatives do.
    """
    contrastive, itm = retrieval_heads(model)

    def keys(encoders: Iterable[str]) -> tuple[str, ...]:
        views = [v for e in encoders for v in model.encoders[e].data_needs()]
        return tuple(dict.fromkeys(k for v in views for k in stream.view_keys(v)))

    if contrastive is not None:
        a, b = contrastive.cfg.modalities
        if a == b:
            raise ValueError(f"contrastive.modalities [{a}, {b}]: retrieval needs two encoders")
        return Sides(keys([a]), keys([b]), a, b)
    assert itm is not None

    def swaps(k: str) -> bool:
        return any(fnmatch.fnmatchcase(k, pat) for pat in itm.cfg.swap_keys)

    swapped = [e for e in model.encoders if any(swaps(k) for k in keys([e]))]
    rest = [e for e in model.encoders if e not in swapped]
    if swapped and rest:
        return Sides(keys(swapped), keys(rest))
    joined = tuple(k for k in batch if swaps(k))
    text = [e for e in model.encoders if model.encoders[e].modality == "text"]
    if not swapped and joined and late and text:
        other = keys(e for e in model.encoders if e not in text)
        return Sides(joined + other, keys(text), pair_stages=tuple(late))
    raise ValueError(
        f"itm.swap_keys {itm.cfg.swap_keys} must match the inputs of some encoders, not all"
    )


def recall_at_k(
    sim_IT: torch.Tensor, ks: Iterable[int] = KS, sim_t2i_IT: torch.Tensor | None = None
) -> dict[str, float]:
    """Recall@k for square similarity matrices whose diagonal holds the true pairs.

    A rank is the number of candidates scoring strictly higher than the true one.
    ``sim_t2i_IT`` scores the text→image direction when it differs (ITM re-ranking).
    Also the median rank (``MdR``, 1 = first, as MSR-VTT papers report it).
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
    for d, rank in (("i2t", rank_i2t), ("t2i", rank_t2i)):
        out[f"{d}_MdR"] = rank.float().add(1).median().item()
    return out


def recall_multi(sim_IQ: torch.Tensor, item_of_Q: torch.Tensor, ks: Iterable[int] = KS) -> dict:
    """R@k and mAP@10 both ways when each item has several captions (Clotho, AudioCaps).

    ``sim_IQ`` scores I items against Q captions; caption q belongs to item ``item_of_Q[q]``.
    Text→item (``t2i``): each caption ranks the items; its one relevant item at rank r
    (0-based, candidates scoring strictly higher) gives R@k = [r < k] and AP@10 = 1/(r+1)
    if r < 10 — the DCASE / AudioCaps text-to-audio protocol. Item→text (``i2t``): each item
    ranks all captions; R@k = one of its captions in the top k; AP@10 = the mean over its
    relevant captions within the top 10 of the precision at their ranks, divided by
    min(relevant, 10).
    """
    n_items, Q = sim_IQ.shape
    if item_of_Q.shape != (Q,) or (item_of_Q < 0).any() or (item_of_Q >= n_items).any():
        raise ValueError(f"item_of_Q must give an item in [0, {n_items}) for each of {Q} captions")
    own_Q = sim_IQ[item_of_Q, torch.arange(Q)]
    rank_Q = (sim_IQ > own_Q[None, :]).sum(0)  # per caption, over items
    relevant_IQ = item_of_Q[None, :] == torch.arange(n_items)[:, None]
    out: dict[str, float] = {}
    # item → text: sort the captions of each item (ties: the relevant one last, pessimistic)
    pre_IQ = torch.argsort(relevant_IQ.int(), dim=1, stable=True)  # non-relevant first
    by_score_IQ = torch.sort(sim_IQ.gather(1, pre_IQ), dim=1, descending=True, stable=True)
    hit_IQ = relevant_IQ.gather(1, pre_IQ.gather(1, by_score_IQ.indices))
    first_I = torch.where(hit_IQ.any(1), hit_IQ.float().argmax(1), torch.full((n_items,), Q))
    for k in ks:
        out[f"t2i_R@{k}"] = (rank_Q < k).float().mean().item()
        out[f"i2t_R@{k}"] = (first_I < k).float().mean().item()
    out["t2i_mAP@10"] = torch.where(rank_Q < 10, 1.0 / (rank_Q + 1).float(), 0.0).mean().item()
    top_I10 = hit_IQ[:, :10].float()
    precision_I10 = top_I10.cumsum(1) / torch.arange(1, top_I10.shape[1] + 1)
    n_rel_I = relevant_IQ.sum(1).clamp(max=10).clamp(min=1)
    out["i2t_mAP@10"] = ((precision_I10 * top_I10).sum(1) / n_rel_I).mean().item()
    out["t2i_MdR"] = rank_Q.float().add(1).median().item()
    out["i2t_MdR"] = first_I.float().add(1).median().item()
    return out


def _take(data: dict[str, Any], keys: Sequence[str], idx: torch.Tensor) -> dict[str, Any]:
    return {k: data[k][idx] for k in keys if k in data}


@torch.no_grad()
def embed_rows(
    model: PretrainModel,
    head: Contrastive,
    data: dict[str, Any],
    keys: Sequence[str],
    side: str,
    device: torch.device,
    batch_size: int,
) -> torch.Tensor:
    """Normalised embeddings [N,E] (on ``device``) of one side of the rows of ``data``.

    Only ``keys`` (that side's inputs) are read, ``batch_size`` rows at a time, so a
    side is encoded alone: the one embedding loop of retrieval and of search indexes.
    """
    n = len(data[KEY])
    out = []
    for s in range(0, n, batch_size):
        idx = torch.arange(s, min(s + batch_size, n))
        out.append(head.embed(model.fuse(move_to(_take(data, keys, idx), device)), side))
    return torch.cat(out)


@torch.no_grad()
def itm_scores(
    head: ImageTextMatching,
    model: PretrainModel,
    data: dict[str, Any],
    sides: Sides,
    img_P: torch.Tensor,
    txt_P: torch.Tensor,
    device: torch.device,
    batch_size: int,
) -> torch.Tensor:
    """ITM scores [P] of the pairs (item img_P[p], text txt_P[p])."""
    out = []
    for s in range(0, len(img_P), batch_size):
        pair = sides.pair(
            {
                **_take(data, sides.item_keys, img_P[s : s + batch_size]),
                **_take(data, sides.query_keys, txt_P[s : s + batch_size]),
            }
        )
        out.append(head.score(model.fuse(move_to(pair, device))).cpu())
    return torch.cat(out)


@torch.no_grad()
def similarity(
    model: PretrainModel,
    data: dict[str, Any],
    sides: Sides,
    device: torch.device,
    batch_size: int = 128,
    rerank_k: int = 0,
    itm_all: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Item×text scores [N,N] for item→text and for text→item retrieval.

    Dual encoders: the dot product of the contrastive embeddings (both directions alike).
    With an ITM head and ``rerank_k``: the top-k of that cheap first stage, per query, are
    re-scored by ITM plus the contrastive logit (ALBEF) and ranked above the rest. Without a
    contrastive head, or with ``itm_all`` (UNITER's protocol): ITM scores every pair, N²
    fused pairs.
    """
    n = len(data[KEY])
    contrastive, itm = retrieval_heads(model)
    if itm_all and itm is None:
        raise ValueError(
            f"--itm-all scores pairs with an ITM head; this model's objectives are "
            f"{objective_types(model)}"
        )
    if contrastive is None or itm_all:
        assert itm is not None
        img_P = torch.arange(n).repeat_interleave(n)
        txt_P = torch.arange(n).repeat(n)
        full = itm_scores(itm, model, data, sides, img_P, txt_P, device, batch_size).view(n, n)
        return full, full
    img = embed_rows(model, contrastive, data, sides.item_keys, sides.items, device, batch_size)
    txt = embed_rows(model, contrastive, data, sides.query_keys, sides.queries, device, batch_size)
    first = (img @ txt.T).cpu()
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
        itm_P = itm_scores(itm, model, data, sides, img_P, txt_P, device, batch_size)
        scores = albef_rerank_score(itm_P, first[img_P, txt_P], contrastive)
        sim = first.clone()
        lift = first.max() - scores.min() + 1.0  # re-ranked candidates stay above the rest
        sim[img_P, txt_P] = scores + lift
        reranked.append(sim)
    return reranked[0], reranked[1]


def albef_rerank_score(itm: Any, cosine: Any, contrastive: Contrastive) -> Any:
    """The score that orders a re-ranked top k: ITM's logit margin plus the contrastive logit
    (the cosine at the head's learned scale), ALBEF's rule (its retrieval code adds the ITM
    score to the top-k similarity). ITM alone threw away what ITC knew: on toyworld
    (albef_tiny, 1000 steps, 500 test pairs, k=16) it lowered R@1 from 94.0 / 93.4% to
    81.4 / 82.8%; the sum gives 95.0 / 93.8%. Tensors or numpy arrays of one shape."""
    return itm + float(contrastive.scale().detach()) * cosine


@torch.no_grad()
def pair_scores(
    model: PretrainModel, data: dict[str, Any], sides: Sides, device: torch.device, batch_size: int
) -> torch.Tensor:
    """Scores [N] of the pairs (item i, text i): contrastive dot products, else ITM."""
    n = len(data[KEY])
    contrastive, itm = retrieval_heads(model)
    if contrastive is None:
        assert itm is not None
        idx = torch.arange(n)
        return itm_scores(itm, model, data, sides, idx, idx, device, batch_size)
    z_items = embed_rows(model, contrastive, data, sides.item_keys, sides.items, device, batch_size)
    z_texts = embed_rows(
        model, contrastive, data, sides.query_keys, sides.queries, device, batch_size
    )
    return (z_items * z_texts).sum(-1).cpu()


def evaluate_reversal(
    path: str,
    *,
    split: str = "test",
    shards: str | None = None,
    max_items: int = 1000,
    batch_size: int = 128,
    field: str = "reversed_captions",
    overrides: Sequence[str] = (),
    device: str = "cpu",
) -> dict[str, float]:
    """The reversal test: how often a clip scores its own caption above the caption of the
    same clip played backwards (json ``field``, e.g. toyworld video's ``reversed_captions``).

    Both captions hold the same objects and events, so only the order of the frames tells
    them apart: a model that sees the frames as an unordered bag scores 50 % (ties count
    one half).
    """
    model, tokenizer, cfg = load_pretrained(path, overrides)
    dev = torch.device(device)
    model.to(dev)
    scores = []
    text = cfg.data.modalities.get("text") or TextData.Config()
    for captions in ("captions", field):
        over = replace(text, captions_field=captions)
        data, sides = _batch_and_sides(model, tokenizer, cfg, split, shards, max_items, over)
        scores.append(pair_scores(model, data, sides, dev, batch_size))
    true_N, reversed_N = scores
    wins = (true_N > reversed_N).float() + 0.5 * (true_N == reversed_N).float()
    return {"n": float(len(wins)), "reversal_acc": wins.mean().item(), "chance": 0.5}


def evaluate_retrieval(
    path: str,
    *,
    split: str = "test",
    shards: str | None = None,
    max_items: int = 1000,
    batch_size: int = 128,
    rerank_k: int = 0,
    overrides: Sequence[str] = (),
    device: str = "cpu",
    captions: int = 1,
    itm_all: bool = False,
) -> dict[str, float]:
    """R@1/5/10 (both directions) of a checkpoint on ``split`` (or explicit ``shards``).

    The first ``max_items`` samples, decoded as evaluation (the first caption language,
    see ``data.modalities.text.caption_languages``), make one batch padded to its longest.
    ``captions`` > 1: the several-captions protocol (Clotho, AudioCaps: 5 per clip), see
    :func:`recall_multi`; a dual encoder (contrastive head) only. ``itm_all``: ITM scores
    all N² pairs (see :func:`similarity`). The result also holds what ranking cost:
    ``fused_pairs`` (pairs through the fusion model) and ``seconds``.
    """
    model, tokenizer, cfg = load_pretrained(path, overrides)
    dev = torch.device(device)
    model.to(dev)
    if rerank_k and retrieval_heads(model)[1] is None:
        raise ValueError(
            "--rerank-k re-ranks with an ITM head (a fusion model, ALBEF style); this model's "
            f"objectives are {objective_types(model)}"
        )
    if itm_all and rerank_k:
        raise ValueError("--itm-all scores every pair; --rerank-k re-scores a top k: pick one")
    if captions > 1:
        if rerank_k or itm_all:
            raise ValueError("--rerank-k and --itm-all are not supported with --captions > 1")
        return _evaluate_multi(
            model, tokenizer, cfg, split, shards, max_items, batch_size, dev, captions
        )
    data, sides = _batch_and_sides(model, tokenizer, cfg, split, shards, max_items)
    t0 = time.perf_counter()
    sim_i2t, sim_t2i = similarity(model, data, sides, dev, batch_size, rerank_k, itm_all)
    took = time.perf_counter() - t0
    n = sim_i2t.shape[0]
    contrastive = retrieval_heads(model)[0]
    fused = n * n if itm_all or contrastive is None else 2 * n * min(rerank_k, n)
    result = {"n": float(n), **recall_at_k(sim_i2t, sim_t2i_IT=sim_t2i)}
    result.update({"fused_pairs": float(fused), "seconds": round(took, 2)})
    result.update({f"chance_R@{k}": min(k / n, 1.0) for k in KS})
    return result


def _first_batch(model, tokenizer, cfg, split, shards, max_items, text=None):
    """The first ``max_items`` evaluation samples as one batch (text plug-in ``text``)."""
    data, _ = _batch_and_sides(model, tokenizer, cfg, split, shards, max_items, text)
    return data


def _batch_and_sides(model, tokenizer, cfg, split, shards, max_items, text=None):
    """The first ``max_items`` evaluation samples as one batch, and the retrieval sides.

    The batch stops where training's ITM forms its negatives; the later stages run on it
    whole, or on every formed pair when the sides say so (:func:`retrieval_sides`).
    """
    data_cfg = cfg.data
    if text is not None:
        data_cfg = replace(cfg.data, modalities={**cfg.data.modalities, "text": text})
    stream = stream_config(
        data_cfg, tokenizer, split=split, needs=model.data_needs(), shards=shards, seed=cfg.seed
    )
    stream.batch_size = max_items
    at = SwapNegatives.data_priority
    late = [t for t in stream.transforms if t.data_priority > at]
    early = [t for t in stream.transforms if t.data_priority <= at]
    data = next(iter(single_pass(replace(stream, transforms=early))))
    if END in data:
        raise ValueError(f"the evaluation split ({shards or split}) produced no samples")
    sides = retrieval_sides(model, stream, list(data), late)
    return (data if sides.pair_stages else run_stages(late, data)), sides


@torch.no_grad()
def _evaluate_multi(model, tokenizer, cfg, split, shards, max_items, batch_size, dev, captions):
    """Items embedded once; their captions number 0..captions-1 embedded in turn (a sample
    without caption j is skipped for that round); rows matched to items by sample key."""
    contrastive, _ = retrieval_heads(model)
    if contrastive is None:
        raise ValueError("the several-captions protocol needs a contrastive (dual encoder) head")
    base = cfg.data.modalities.get("text") or TextData.Config()

    def embed(data: dict[str, Any], keys: Sequence[str], side: str) -> torch.Tensor:
        return embed_rows(model, contrastive, data, keys, side, dev, batch_size).cpu()

    data, sides = _batch_and_sides(model, tokenizer, cfg, split, shards, max_items, base)
    items_IE = embed(data, sides.item_keys, sides.items)
    index = {k: i for i, k in enumerate(data[KEY])}
    texts, owner = [], []
    for j in range(captions):
        data_j = _first_batch(
            model, tokenizer, cfg, split, shards, max_items, replace(base, caption_index=j)
        )
        keep = [q for q, k in enumerate(data_j[KEY]) if k in index]
        if not keep:
            continue
        sub = _take(data_j, sides.query_keys, torch.tensor(keep))
        sub[KEY] = [data_j[KEY][q] for q in keep]
        texts.append(embed(sub, sides.query_keys, sides.queries))
        owner += [index[data_j[KEY][q]] for q in keep]
    sim_IQ = items_IE @ torch.cat(texts).T
    n = len(items_IE)
    result = {"n": float(n), "captions": float(sim_IQ.shape[1])}
    result.update(recall_multi(sim_IQ, torch.tensor(owner)))
    result.update({f"chance_R@{k}": min(k / n, 1.0) for k in KS})
    return result


def format_table(rows: dict[str, dict[str, float]]) -> str:
    """A plain-text table: one row per named result, columns R@1/5/10 both ways + chance."""
    cols = [f"{d}_R@{k}" for d in ("i2t", "t2i") for k in KS] + ["chance_R@1"]
    ranks = ["i2t_MdR", "t2i_MdR"]
    if any("t2i_mAP@10" in r for r in rows.values()):
        cols += ["i2t_mAP@10", "t2i_mAP@10"]
    head = f"{'':<14}" + "".join(f"{c:>12}" for c in cols + ranks)
    lines = [head]
    for name, r in rows.items():
        cells = [f"{100 * r[c]:>11.1f}%" if c in r else f"{'-':>12}" for c in cols]
        cells += [f"{r[c]:>12.1f}" if c in r else f"{'-':>12}" for c in ranks]
        lines.append(f"{name:<14}" + "".join(cells))
    return "\n".join(lines)
