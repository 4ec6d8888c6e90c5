"""The second image of an image pair (NLVR2) and the pair's truth label, from one sample.

An NLVR2 sample holds the left image's ``regions.npz`` (the regions plug-in reads it, as for
any sample), the right image's ``right.regions.npz`` (the same format) and a ``json`` whose
``label`` is true or false (``True``/``False`` strings, as NLVR2's files write them, or
booleans). This plug-in (``image_pair``) gives ``right_region_feats [B,R,F]``,
``right_region_boxes [B,R,4]``, ``right_region_mask [B,R]`` and ``pair_labels [B]`` (1 =
true). The ``image_pair`` head's data side then turns each sample into two rows, the
statement with each image (:class:`mmptm.objectives.nlvr2.PairRows`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from mmptm.modalities.base import Modality, Sample
from mmptm.modalities.regions_io import load_regions
from mmptm.registry import MODALITIES

#: the right image's member
RIGHT_MEMBER = "right.regions.npz"
_TRUTH = {"true": 1, "false": 0}


def read_truth(value: Any) -> int:
    """1 / 0 of an NLVR2 label ("True", "False", case-insensitive, or a bool)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and value.strip().lower() in _TRUTH:
        return _TRUTH[value.strip().lower()]
    raise ValueError(f"label must be True or False, got {value!r}")


@MODALITIES.register("image_pair")
class ImagePairData(Modality):
    """The right image's regions and the pair's label."""

    members: ClassVar[tuple[str, ...]] = (RIGHT_MEMBER, "json")
    keys: ClassVar[tuple[str, ...]] = (
        "right_region_feats", "right_region_boxes", "right_region_mask", "pair_labels",
    )  # fmt: skip

    @dataclass
    class Config:
        type: str = "image_pair"

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        if RIGHT_MEMBER not in sample:
            raise ValueError(f"no {RIGHT_MEMBER} member; has {sorted(sample)}")
        arrays = load_regions(sample[RIGHT_MEMBER])
        feats, boxes = arrays.get("features"), arrays.get("boxes")
        if feats is None or boxes is None or feats.ndim != 2 or boxes.shape != (len(feats), 4):
            raise ValueError(f"{RIGHT_MEMBER}: needs features [R,F] and boxes [R,4]")
        return {
            "right_region_feats": torch.from_numpy(feats).float(),
            "right_region_boxes": torch.from_numpy(boxes).float(),
            "pair_labels": read_truth(meta.get("label")),
        }

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        counts = [len(s["right_region_boxes"]) for s in samples]
        B, R = len(samples), max(counts)
        F = samples[0]["right_region_feats"].shape[-1]
        feats_BRF, boxes_BR4 = torch.zeros(B, R, F), torch.zeros(B, R, 4)
        for i, s in enumerate(samples):
            feats_BRF[i, : counts[i]] = s["right_region_feats"]
            boxes_BR4[i, : counts[i]] = s["right_region_boxes"]
        return {
            "right_region_feats": feats_BRF,
            "right_region_boxes": boxes_BR4,
            "right_region_mask": torch.arange(R)[None, :] < torch.tensor(counts)[:, None],
            "pair_labels": torch.tensor([s["pair_labels"] for s in samples]),
        }


__all__ = ["RIGHT_MEMBER", "ImagePairData", "read_truth"]
