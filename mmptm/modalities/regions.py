"""The regions plug-in: a ``regions.npz`` member (detector boxes and features) → padded tensors.

``regions.npz`` holds ``features`` float32 [R,F], ``boxes`` float32 [R,4] (x1, y1, x2, y2
normalised to [0, 1]), ``image_size`` int32 [2] (w, h), and optionally ``probs`` float32
[R,C] (the detector's class distribution) and ``labels`` int64 [R]
(:mod:`mmptm.modalities.regions_io` reads and writes the format).
Batches get ``region_feats [B,R,F]``, ``region_boxes [B,R,4]``, ``region_mask [B,R]`` (True =
real), ``region_probs`` and ``region_labels`` (-1 for padding), padded to the most regions
in the batch. With ``Config.entities`` (a json field holding one entity id or null per
region, in npz order: toyworld knowledge's ``region_entities``) they also get
``region_entity_ids [B,R]``, the entity's row (-1: none), string ids looked up in
``entity_vocabulary`` (an id list; an id it lacks is counted and dropped, as the text
plug-in's spans).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from mmptm.modalities.base import Modality, Sample, read_id_list
from mmptm.modalities.regions_io import MEMBER, REGION_ARRAYS, load_regions, regions_npz_bytes
from mmptm.registry import MODALITIES

log = logging.getLogger(__name__)

# batch key → (npz array, dtype, padding value)
_BATCH = {
    "region_feats": ("features", torch.float32, 0.0),
    "region_boxes": ("boxes", torch.float32, 0.0),
    "region_probs": ("probs", torch.float32, 0.0),
    "region_labels": ("labels", torch.int64, -1),
}


@MODALITIES.register("regions")
class RegionData(Modality):
    """Detector regions of an image: features, boxes, and the detector's class outputs."""

    members: ClassVar[tuple[str, ...]] = (MEMBER, "json")

    @dataclass
    class Config:
        type: str = "regions"
        #: json field with one entity id (or null) per region → ``region_entity_ids``; "" = none
        entities: str = ""
        #: id list (one per line, row i = line i) mapping string entity ids to rows
        entity_vocabulary: str = ""

    def __init__(self, cfg: Config, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.vocabulary: dict[str, int] | None = None
        if cfg.entity_vocabulary:
            self.vocabulary = read_id_list(cfg.entity_vocabulary)
        #: string entity ids the vocabulary lacks, dropped (in this process)
        self.unknown_ids = 0

    @property
    def keys(self) -> tuple[str, ...]:  # type: ignore[override]
        extra = ("region_entity_ids",) if self.cfg.entities else ()
        return (*_BATCH, "region_mask", *extra)

    def _entity_ids(self, meta: dict[str, Any], n: int) -> torch.Tensor:
        """The entity row of each of the ``n`` regions (-1: none) from the json field."""
        name = self.cfg.entities
        value = meta.get(name)
        if value is None:
            return torch.full((n,), -1, dtype=torch.long)
        if not isinstance(value, list) or len(value) != n:
            raise ValueError(f"json {name!r} must list one entity id or null per region ({n})")
        rows = []
        for v in value:
            if v is None:
                rows.append(-1)
            elif isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                rows.append(v)
            elif isinstance(v, str) and self.vocabulary is not None:
                row = self.vocabulary.get(v, -1)
                if row < 0:
                    self.unknown_ids += 1
                    if self.unknown_ids in (1, 10, 100, 1000):
                        log.warning("region entities: %d ids not in %s; dropped",
                                    self.unknown_ids, self.cfg.entity_vocabulary)  # fmt: skip
                rows.append(row)
            else:
                raise ValueError(
                    f"json {name!r}: {v!r} is not an entity row, an id string (with "
                    "entity_vocabulary) or null"
                )
        return torch.tensor(rows, dtype=torch.long)

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        if MEMBER not in sample:
            raise ValueError(f"no {MEMBER} member; has {sorted(sample)}")
        arrays = load_regions(sample[MEMBER])
        for key in ("features", "boxes"):
            if key not in arrays:
                raise ValueError(f"{MEMBER} lacks {key!r} (has {sorted(arrays)})")
        feats, boxes = arrays["features"], arrays["boxes"]
        if feats.ndim != 2 or boxes.shape != (feats.shape[0], 4):
            raise ValueError(f"{MEMBER}: features {feats.shape} / boxes {boxes.shape} mismatch")
        p = self.prefix(self.views[0])
        out = {
            p + key: torch.from_numpy(arrays[name]).to(dtype)
            for key, (name, dtype, _) in _BATCH.items()
            if name in arrays
        }
        if self.cfg.entities:
            out[p + "region_entity_ids"] = self._entity_ids(meta, len(boxes))
        return out

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        p = self.prefix(self.views[0])
        counts = [len(s[p + "region_boxes"]) for s in samples]
        B, R = len(samples), max(counts)
        out = {p + "region_mask": torch.arange(R)[None, :] < torch.tensor(counts)[:, None]}
        for key, (_, dtype, fill) in {**_BATCH, "region_entity_ids": ("", torch.int64, -1)}.items():
            if p + key not in samples[0]:
                continue
            first = samples[0][p + key]
            t = torch.full((B, R, *first.shape[1:]), fill, dtype=dtype)
            for i, s in enumerate(samples):
                t[i, : counts[i]] = s[p + key]
            out[p + key] = t
        return out


#: the format's names, for the writers that import them from the plug-in
__all__ = ["MEMBER", "REGION_ARRAYS", "RegionData", "load_regions", "regions_npz_bytes"]
