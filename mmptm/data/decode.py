"""Per-sample decoding and batch assembly, delegated to the modality plug-ins.

The decoder parses a sample's ``json`` once and asks each plug-in for its part; the collate
function asks each plug-in to batch its keys. Neither knows any modality: what a sample
holds and how it becomes tensors is the plug-ins' (``mmptm/modalities``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mmptm.batch import KEY, RECORD
from mmptm.modalities.base import Modality, Sample


@dataclass
class Decoder:
    """Decodes a raw sample into what the plug-ins make of it; raises ValueError if it can't.

    Training draws the plug-ins' random choices (caption language, pair order,
    augmentation) from a generator seeded by (seed, epoch, sample key), so they do not
    depend on worker count or resume; evaluation (``train=False``) makes none.
    ``record`` (picklable; it runs in the loader workers) keeps what a consumer wants of the
    raw sample besides the tensors, e.g. a search index's captions and thumbnail: its result
    for (raw sample, parsed json) rides along under ``__record__``.
    """

    modalities: Sequence[Modality]
    seed: int = 0
    epoch: int = 0
    train: bool = True
    record: Callable[[Sample, dict[str, Any]], Any] | None = None

    def __call__(self, sample: Sample) -> Sample:
        key = sample[KEY]
        meta = json.loads(sample["json"]) if "json" in sample else {}
        if not isinstance(meta, dict):
            raise ValueError(f"json member is a {type(meta).__name__}, expected an object")
        rng = random.Random(f"{self.seed}/{self.epoch}/{key}") if self.train else None
        out: Sample = {KEY: key}
        for m in self.modalities:
            part = m.decode(sample, meta, rng)
            out.update(m.augment(part, rng) if rng is not None else part)
        if self.record is not None:
            out[RECORD] = self.record(sample, meta)
        return out


@dataclass
class Collate:
    """Stacks decoded samples: each plug-in pads or stacks its own keys."""

    modalities: Sequence[Modality]

    def __call__(self, samples: list[Sample]) -> dict[str, Any]:
        batch: dict[str, Any] = {KEY: [s[KEY] for s in samples]}
        if samples and RECORD in samples[0]:
            batch[RECORD] = [s[RECORD] for s in samples]
        for m in self.modalities:
            batch.update(m.collate(samples))
        return batch
