"""The box a referring expression names, riding along in a sample's ``json``.

``ref_box``: ``json["ref_box"]`` = [x1, y1, x2, y2] normalised to [0, 1] (the frame of the
``regions.npz`` boxes; ``mmptm data refcoco`` and ``mmptm data toyworld-refexp`` write it)
→ ``ref_box [B,4]`` float32. The ``region_selection`` head declares it, as VQA's head
declares its answers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from mmptm.modalities.base import Modality, Sample
from mmptm.registry import MODALITIES


def read_box(value: Any, where: str = "ref_box") -> list[float]:
    """A normalised [x1, y1, x2, y2] box, checked: four finite numbers, x1 <= x2, y1 <= y2."""
    ok = isinstance(value, (list, tuple)) and len(value) == 4
    ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if not ok or not all(math.isfinite(v) for v in value):
        raise ValueError(f"{where} must be [x1, y1, x2, y2] (four numbers), got {value!r}")
    x1, y1, x2, y2 = (float(v) for v in value)
    if x2 < x1 or y2 < y1:
        raise ValueError(f"{where} {value!r} has x2 < x1 or y2 < y1")
    return [x1, y1, x2, y2]


@MODALITIES.register("ref_box")
class RefBoxData(Modality):
    """The gold box of a referring expression."""

    members: ClassVar[tuple[str, ...]] = ("json",)
    keys: ClassVar[tuple[str, ...]] = ("ref_box",)

    @dataclass
    class Config:
        type: str = "ref_box"

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        return {self.prefix(self.views[0]) + "ref_box": read_box(meta.get("ref_box"))}

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        key = self.prefix(self.views[0]) + "ref_box"
        return {key: torch.tensor([s[key] for s in samples], dtype=torch.float32)}


__all__ = ["RefBoxData", "read_box"]
