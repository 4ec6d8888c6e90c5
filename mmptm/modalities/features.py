"""Pre-extracted features: ``features`` (per-frame vectors as they are) and ``units`` (each
vector → the id of its nearest codebook centroid: VideoBERT's visual words, HuBERT's units).

Both read one member (``npy`` unless ``member`` says otherwise) holding a ``[T,F]`` float16
or float32 (float64 is accepted too) array in ``np.save`` format, and keep at most
``frames`` rows: a longer sequence gives ``frames`` rows spread over it in equal segments (a
random row of each when training, each segment's centre when evaluating; as the video
plug-in picks frames). When one model reads both plug-ins from one member, training draws
their rows independently.

- ``features``: ``features`` float32 [B,T,F] (0 on padding) + ``features_mask`` bool [B,T];
  ``dim`` (F) is a fact the encoder declares.
- ``units``: ``unit_ids`` long [B,T] (0 on padding) + ``unit_mask`` bool [B,T]; ``codebook``
  (a fact the encoder declares) is a ``.npy`` [K,F] written by ``mmptm units fit``; a
  hierarchical codebook is stored flat, its row = the leaf id, and vectors go to the
  nearest row. The codebook is loaded once per process (loader worker).

A member that is not a 2-D float array of width F with at least one row, or that holds
NaN/Inf, raises ``ValueError`` (the sample is skipped and counted).
Legend: B batch, T rows (frames), F feature width, K centroids.
"""

from __future__ import annotations

import io
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from mmptm.modalities.base import DataContext, Modality, Sample, segment_indices
from mmptm.registry import MODALITIES


def load_vectors(data: bytes, where: str, dim: int = 0) -> np.ndarray:
    """An ``np.save``'d float16/32/64 ``[T,F]`` array (T >= 1, finite; F = ``dim`` if given) as
    float32; ``ValueError`` naming ``where`` otherwise."""
    try:
        x = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{where}: not an npy array ({e})") from None
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float16, np.float32, np.float64):
        raise ValueError(f"{where}: expected a float array, got {getattr(x, 'dtype', x)}")
    if x.ndim != 2 or len(x) == 0 or (dim and x.shape[1] != dim):
        want = f"[T,{dim}]" if dim else "[T,F]"
        raise ValueError(f"{where}: shape {x.shape} is not {want} with T >= 1")
    if not np.isfinite(x).all():
        raise ValueError(f"{where}: holds NaN or Inf")
    return x.astype(np.float32, copy=False)


def nearest(x_NF: torch.Tensor, c_KF: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index of the nearest centroid [N], squared distance to it [N]) for each row."""
    d2_NK = (x_NF * x_NF).sum(1, keepdim=True) - 2 * x_NF @ c_KF.T + (c_KF * c_KF).sum(1)
    d2_N, ids_N = d2_NK.min(dim=1)
    return ids_N, d2_N.clamp_min(0)


def load_codebook(path: str | Path) -> np.ndarray:
    """A codebook ``.npy`` [K,F] (finite floats) as float32."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"codebook {str(path)!r} cannot be read: {e}") from None
    return load_vectors(data, f"codebook {str(path)!r}")


class _Sequences(Modality):
    """What the two plug-ins share: reading the member, keeping at most ``frames`` rows."""

    def __init__(self, cfg: Any, *, views: Sequence[str], context: DataContext) -> None:
        super().__init__(cfg, views=views, context=context)
        if cfg.frames < 1 or not cfg.member:
            raise ValueError(f"data.modalities.{self.name}: frames must be >= 1, member set")

    def rows(self, sample: Sample, rng: random.Random | None, dim: int) -> np.ndarray:
        """The member's rows (at most ``frames``), float32 [t,F]."""
        member = self.cfg.member
        if member not in sample:
            raise ValueError(f"no {member} member; has {sorted(sample)}")
        x_TF = load_vectors(sample[member], member, dim)
        return x_TF[segment_indices(len(x_TF), self.cfg.frames, rng)]

    def _pad(
        self, rows: list[torch.Tensor], fill: float | int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.tensor([len(r) for r in rows])
        T = int(lengths.max())
        out = torch.full((len(rows), T, *rows[0].shape[1:]), fill, dtype=rows[0].dtype)
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        return out, torch.arange(T)[None, :] < lengths[:, None]


@MODALITIES.register("features")
class FeaturesData(_Sequences):
    """Per-frame feature vectors as they are (CBT's visual features)."""

    members: ClassVar[tuple[str, ...]] = ("npy",)
    keys: ClassVar[tuple[str, ...]] = ("features", "features_mask")

    @dataclass
    class Config:
        type: str = "features"
        #: feature width F (declared by the encoder)
        dim: int = 0
        #: rows kept per sample (T)
        frames: int = 32
        #: the member holding the [T,F] array
        member: str = "npy"

    def __init__(self, cfg: Config, *, views: Sequence[str], context: DataContext) -> None:
        super().__init__(cfg, views=views, context=context)
        if cfg.dim < 1:
            raise ValueError("data.modalities.features.dim is unset: no encoder declared it")

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        x_TF = torch.from_numpy(self.rows(sample, rng, self.cfg.dim))
        return {self.prefix(self.views[0]) + "features": x_TF}

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        p = self.prefix(self.views[0])
        x_BTF, mask_BT = self._pad([s[p + "features"] for s in samples], 0.0)
        return {p + "features": x_BTF, p + "features_mask": mask_BT}


@MODALITIES.register("units")
class UnitsData(_Sequences):
    """Per-frame feature vectors → ids of their nearest codebook centroids."""

    members: ClassVar[tuple[str, ...]] = ("npy",)
    keys: ClassVar[tuple[str, ...]] = ("unit_ids", "unit_mask")

    @dataclass
    class Config:
        type: str = "units"
        #: ``.npy`` [K,F] codebook from ``mmptm units fit`` (declared by the encoder)
        codebook: str = ""
        #: rows kept per sample (T)
        frames: int = 32
        #: the member holding the [T,F] array
        member: str = "npy"

    def __init__(self, cfg: Config, *, views: Sequence[str], context: DataContext) -> None:
        super().__init__(cfg, views=views, context=context)
        if not cfg.codebook:
            raise ValueError("data.modalities.units.codebook is unset: no encoder declared it")
        self._codebook_KF: torch.Tensor | None = torch.from_numpy(load_codebook(cfg.codebook))
        self.dim = self._codebook_KF.shape[1]

    def __getstate__(self) -> dict[str, Any]:  # loader workers load it themselves, once
        return {**self.__dict__, "_codebook_KF": None}

    @property
    def codebook_KF(self) -> torch.Tensor:
        if self._codebook_KF is None:
            self._codebook_KF = torch.from_numpy(load_codebook(self.cfg.codebook))
        return self._codebook_KF

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        x_TF = torch.from_numpy(self.rows(sample, rng, self.dim))
        ids_T, _ = nearest(x_TF, self.codebook_KF)
        return {self.prefix(self.views[0]) + "unit_ids": ids_T}

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        p = self.prefix(self.views[0])
        ids_BT, mask_BT = self._pad([s[p + "unit_ids"] for s in samples], 0)
        return {p + "unit_ids": ids_BT, p + "unit_mask": mask_BT}


__all__ = ["FeaturesData", "UnitsData", "load_codebook", "load_vectors", "nearest"]
