"""Codebooks for discrete units (VideoBERT's visual words, HuBERT's targets): k-means over
feature vectors read from shards, written for the ``units`` plug-in.

:func:`kmeans` is k-means++ seeding then Lloyd iterations in torch (any device), chunked so
memory stays O(chunk × K). :func:`hierarchical_kmeans` splits each cluster again with
``branch`` centroids, ``levels`` deep (VideoBERT: 12⁴ = 20736 words); its codebook is stored
flat, row = leaf id (the leaf's path in base ``branch``), and the ``units`` plug-in maps a
vector to its nearest row. :func:`fit_codebook` is ``mmptm units fit``: read (a seeded
reservoir sample of) the vectors, cluster, write the ``.npy`` [K,F] float32 codebook and a
json sidecar (k, dim, inertia, vectors used, source shards). The vectors are a member's
``[T,F]`` array, or whatever a ``featurize`` callable makes of each sample (HuBERT's MFCC or
teacher features of the audio: ``mmptm.objectives.audio_units``, the objective's own code,
the teacher loaded by ``mmptm.models.resources``).
Legend: N vectors, F their width, K centroids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.encoders.base import VocabInfo
from mmptm.modalities.audio_io import AUDIO_MEMBERS, read_audio, resample
from mmptm.modalities.base import Sample
from mmptm.modalities.features import load_vectors, nearest
from mmptm.models.resources import load_encoder
from mmptm.objectives.audio_units import (
    SAMPLE_RATE,
    Featurizer,
    MfccFeaturizer,
    TeacherFeaturizer,
)
from mmptm.progress import progress_bar

#: sample → its [T,F] float32 vectors; ``ValueError`` skips the sample (counted)
Featurize = Callable[[Sample], np.ndarray]

_CHUNK = 1 << 22  # elements of one [rows, K] distance block


@dataclass
class KMeans:
    """A clustering: centroids, the sum of squared distances to them, Lloyd steps run."""

    centroids_KF: torch.Tensor
    inertia: float
    iterations: int


def assign(x_NF: torch.Tensor, c_KF: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(nearest centroid [N], squared distance [N]), in row chunks."""
    rows = max(1, _CHUNK // len(c_KF))
    parts = [nearest(x_NF[i : i + rows], c_KF) for i in range(0, len(x_NF), rows)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def exact_inertia(x_NF: torch.Tensor, c_KF: torch.Tensor) -> float:
    """Sum of squared distances to the nearest centroid, computed in float64."""
    ids, _ = assign(x_NF, c_KF)
    return float(((x_NF.double() - c_KF.double()[ids]) ** 2).sum())


def kmeans_plus_plus(x_NF: torch.Tensor, k: int, g: torch.Generator) -> torch.Tensor:
    """k-means++ seeding: each next centroid is a row drawn with probability ∝ its squared
    distance to the nearest centroid so far (Arthur & Vassilvitskii 2007)."""
    N = len(x_NF)
    first = int(torch.randint(N, (1,), generator=g))
    c_KF = x_NF.new_empty(k, x_NF.shape[1])
    c_KF[0] = x_NF[first]
    d2_N = ((x_NF - c_KF[0]) ** 2).sum(1)
    for j in range(1, k):
        total = float(d2_N.sum())
        if total > 0:
            i = int(torch.multinomial(d2_N.double().cpu() / total, 1, generator=g))
        else:  # fewer distinct rows than k: duplicates
            i = int(torch.randint(N, (1,), generator=g))
        c_KF[j] = x_NF[i]
        d2_N = torch.minimum(d2_N, ((x_NF - c_KF[j]) ** 2).sum(1))
    return c_KF


def kmeans(
    x_NF: torch.Tensor,
    k: int,
    *,
    iters: int = 100,
    tol: float = 1e-4,
    seed: int = 0,
    progress: bool = False,
) -> KMeans:
    """Lloyd's k-means from k-means++ seeds; stops when the inertia improves by less than
    ``tol`` (relative) or after ``iters`` steps. An empty cluster is re-seeded with the row
    farthest from its centroid."""
    N = len(x_NF)
    if not 1 <= k <= N:
        raise ValueError(f"k-means needs 1 <= k <= vectors, got k={k} for {N} vectors")
    g = torch.Generator().manual_seed(seed)
    c_KF = kmeans_plus_plus(x_NF, k, g)
    prev = float("inf")
    bar = progress_bar(total=iters, desc=f"k-means k={k}", enabled=progress, leave=False)
    steps = 0
    while steps < iters:
        steps += 1
        ids_N, d2_N = assign(x_NF, c_KF)
        inertia = float(d2_N.sum())
        counts_K = torch.bincount(ids_N, minlength=k)
        sums_KF = torch.zeros_like(c_KF).index_add_(0, ids_N, x_NF)
        c_KF = torch.where(counts_K[:, None] > 0, sums_KF / counts_K.clamp_min(1)[:, None], c_KF)
        empty = (counts_K == 0).nonzero().flatten()
        if len(empty):
            far = d2_N.topk(len(empty)).indices
            c_KF[empty] = x_NF[far]
        bar.update(1)
        bar.set_postfix(inertia=f"{inertia:.4g}")
        if len(empty) == 0 and prev - inertia <= tol * prev:
            break
        prev = inertia
    bar.close()
    return KMeans(c_KF, exact_inertia(x_NF, c_KF), steps)


def hierarchical_kmeans(
    x_NF: torch.Tensor,
    levels: int,
    branch: int,
    *,
    iters: int = 100,
    tol: float = 1e-4,
    seed: int = 0,
    progress: bool = False,
) -> KMeans:
    """``branch`` clusters, each split into ``branch`` again, ``levels`` deep: ``branch **
    levels`` leaf centroids, row = leaf id. A cluster with fewer rows than ``branch`` keeps
    its rows and fills the rest of its leaves with its mean."""
    if levels < 1 or branch < 2:
        raise ValueError(f"need levels >= 1 and branch >= 2, got {levels}, {branch}")
    leaves = branch**levels
    bar = progress_bar(total=leaves, desc=f"hierarchical k-means {branch}^{levels}",
                       unit="leaf", enabled=progress)  # fmt: skip
    steps = 0

    def split(rows_NF: torch.Tensor, depth: int, node: int) -> torch.Tensor:
        nonlocal steps
        if len(rows_NF) < branch:  # too few rows to split: they and their mean are the leaves
            fill = rows_NF.mean(0, keepdim=True).expand(branch - len(rows_NF), -1)
            c_BF = torch.cat([rows_NF, fill])
        else:
            fit = kmeans(rows_NF, branch, iters=iters, tol=tol, seed=seed * 7919 + node)
            c_BF, steps = fit.centroids_KF, steps + fit.iterations
        if depth + 1 == levels:
            bar.update(branch)
            return c_BF
        ids_N, _ = assign(rows_NF, c_BF)
        out = []
        for j in range(branch):
            sub = rows_NF[ids_N == j]
            if len(sub) == 0:
                sub = c_BF[j : j + 1]
            out.append(split(sub, depth + 1, node * branch + j + 1))
        return torch.cat(out)

    c_KF = split(x_NF, 0, 0)
    bar.close()
    return KMeans(c_KF, exact_inertia(x_NF, c_KF), steps)


# --------------------------------------------------------------------------------------------
# From shards to a codebook file


@dataclass
class Vectors:
    """Rows read from shards: a uniform sample of at most ``max_vectors`` of them."""

    x_NF: np.ndarray
    seen: int  # rows in all good samples
    samples: int
    skipped: int


def member_vectors(member: str) -> Featurize:
    """The default featurizer: the sample's ``member``, an ``np.save``'d [T,F] array."""

    def featurize(sample: Sample) -> np.ndarray:
        if member not in sample:
            raise ValueError(f"no {member} member; has {sorted(sample)}")
        return load_vectors(sample[member], member)

    return featurize


def read_vectors(
    urls: Sequence[str], member: str = "npy", max_vectors: int = 0, seed: int = 0,
    progress: bool = False, featurize: Featurize | None = None,
) -> Vectors:  # fmt: skip
    """Every row of every sample's ``member`` ([T,F] arrays) — or of ``featurize(sample)``
    when given — or a seeded uniform sample of ``max_vectors`` of them (reservoir sampling:
    one pass, bounded memory). Samples without the member, with a bad array or another width
    F are skipped and counted."""
    featurize = featurize or member_vectors(member)
    handler = SkipCounter()
    rng = np.random.default_rng(seed)
    kept: list[np.ndarray] = []
    reservoir: np.ndarray | None = None
    dim = seen = samples = 0
    samples_it = progress_bar(tar_samples(urls, handler), desc="reading vectors", unit="sample",
                              enabled=progress)  # fmt: skip
    for sample in samples_it:
        try:
            x_TF = featurize(sample)
            if x_TF.ndim != 2 or len(x_TF) == 0 or (dim and x_TF.shape[1] != dim):
                raise ValueError(f"vectors of shape {x_TF.shape} are not [T,{dim or 'F'}], T >= 1")
        except ValueError as e:
            handler.skip(sample, str(e))
            continue
        dim, samples = x_TF.shape[1], samples + 1
        if not max_vectors:
            kept.append(x_TF)
        else:
            if reservoir is None:
                reservoir = np.empty((max_vectors, dim), np.float32)
            fill = min(max(max_vectors - seen, 0), len(x_TF))
            reservoir[seen : seen + fill] = x_TF[:fill]
            # row number j (0-based, j >= max_vectors) replaces a random slot w.p. max/(j+1)
            j_R = np.arange(seen + fill, seen + len(x_TF))
            slot_R = rng.integers(0, j_R + 1) if len(j_R) else j_R
            for r in np.flatnonzero(slot_R < max_vectors):
                reservoir[slot_R[r]] = x_TF[fill + r]
        seen += len(x_TF)
    if max_vectors:
        x = reservoir[: min(seen, max_vectors)] if reservoir is not None else np.empty((0, 0))
    else:
        x = np.concatenate(kept) if kept else np.empty((0, 0), np.float32)
    return Vectors(np.ascontiguousarray(x, np.float32), seen, samples, handler.count)


def fit_codebook(
    shards: str,
    out: str | os.PathLike[str],
    *,
    member: str = "npy",
    k: int = 0,
    levels: int = 1,
    branch: int = 0,
    max_vectors: int = 0,
    iters: int = 100,
    seed: int = 0,
    device: str = "cpu",
    progress: bool = False,
    featurize: Featurize | None = None,
    features: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``mmptm units fit``: cluster the vectors of ``shards``, write ``out`` (``.npy`` [K,F]
    float32) and ``out`` with suffix ``.json`` (what was done); returns the json record.
    Flat with ``k``; hierarchical with ``levels`` > 1 and ``branch`` (K = branch ** levels).
    ``featurize`` makes each sample's vectors (default: the ``member`` array); ``features``
    describes it in the record (the ``hubert`` objective checks it)."""
    if levels > 1:
        if branch < 2 or (k and k != branch**levels):
            raise ValueError(f"--levels {levels} needs --branch >= 2 (K = branch ** levels)")
        k = branch**levels
    elif k < 1:
        raise ValueError("give --k (flat) or --levels and --branch (hierarchical)")
    urls = expand_shards(shards)
    vectors = read_vectors(urls, member, max_vectors, seed, progress, featurize)
    if len(vectors.x_NF) < k:
        raise ValueError(
            f"{len(vectors.x_NF)} vectors in {shards!r} ({vectors.skipped} samples skipped) "
            f"are too few for {k} centroids"
        )
    x_NF = torch.from_numpy(vectors.x_NF).to(device)
    if levels > 1:
        fit = hierarchical_kmeans(x_NF, levels, branch, iters=iters, seed=seed, progress=progress)
    else:
        fit = kmeans(x_NF, k, iters=iters, seed=seed, progress=progress)
    codebook = fit.centroids_KF.float().cpu().numpy()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as f:  # np.save would append .npy to a name without it
        np.save(f, codebook)
    os.replace(tmp, out)
    record = {
        "k": k, "dim": int(codebook.shape[1]), "levels": levels, "branch": branch or None,
        "inertia": fit.inertia, "mean_sq_distance": fit.inertia / len(x_NF),
        "iterations": fit.iterations, "vectors": len(x_NF), "vectors_seen": vectors.seen,
        "samples": vectors.samples, "skipped": vectors.skipped, "member": member,
        "seed": seed, "shards": urls,
    }  # fmt: skip
    if features is not None:
        record["features"] = features
    out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def build_featurizer(
    spec: str, layer: int = 0, *, view: str = "audio", teacher_view: str = "",
    vocab: VocabInfo | None = None, device: str | torch.device = "cpu",
) -> Featurizer:  # fmt: skip
    """``mfcc``, or a run dir / checkpoint (sharded ones too) whose audio encoder at ``layer``
    is the teacher, loaded as the ``hubert`` objective's (:func:`~mmptm.models.resources.
    load_encoder`)."""
    if spec == "mfcc":
        return MfccFeaturizer()
    if not layer:
        raise ValueError(f"--audio-features {spec}: a teacher run needs --layer L (>= 1)")
    encoder = load_encoder(spec, modality="audio", view=teacher_view, name=view, vocab=vocab)
    return TeacherFeaturizer(encoder.to(device), layer, run=spec)


def audio_sample_featurizer(
    featurizer: Featurizer, member: str | None = None
) -> Callable[[Sample], np.ndarray]:
    """sample → [T,F] float32: its audio member (``member``, else the first of
    ``AUDIO_MEMBERS`` it has) decoded, resampled to 16 kHz and featurized; ``ValueError`` on
    bad or too short audio."""
    rate = int(getattr(featurizer, "needs", {}).get("sample_rate") or SAMPLE_RATE)

    def featurize(sample: Sample) -> np.ndarray:
        ext = member or next((m for m in AUDIO_MEMBERS if m in sample), None)
        if ext is None or ext not in sample:
            has = sorted(k for k in sample if not k.startswith("__"))
            raise ValueError(f"no audio member ({member or ', '.join(AUDIO_MEMBERS)}); has {has}")
        wave, sr = read_audio(sample[ext], ext, ext)
        x_TF = featurizer.utterance(torch.from_numpy(resample(wave, sr, rate)))
        if len(x_TF) == 0:
            raise ValueError(f"{ext}: {len(wave) / sr:.3f} s is shorter than one 25 ms frame")
        return x_TF.float().cpu().numpy()

    return featurize


def fit_audio_codebook(
    shards: str,
    out: str | Path,
    *,
    features: str = "mfcc",
    layer: int = 0,
    member: str = "",
    device: str = "cpu",
    **kmeans: Any,
) -> dict[str, Any]:
    """``mmptm units fit --audio-features``: a codebook of the ``hubert`` objective's units
    (``features``: ``mfcc`` or a teacher run at ``layer``) over the audio of ``shards``;
    ``kmeans``: the rest of :func:`~mmptm.train.units.fit_codebook`'s settings."""
    featurizer = build_featurizer(features, layer, device=device)
    return fit_codebook(
        shards, out, member=member or "audio", device=device,
        featurize=audio_sample_featurizer(featurizer, member or None),
        features=featurizer.describe(), **kmeans,
    )  # fmt: skip


__all__ = [
    "KMeans",
    "Vectors",
    "assign",
    "audio_sample_featurizer",
    "build_featurizer",
    "exact_inertia",
    "fit_audio_codebook",
    "fit_codebook",
    "hierarchical_kmeans",
    "kmeans",
    "kmeans_plus_plus",
    "member_vectors",
    "read_vectors",
]
