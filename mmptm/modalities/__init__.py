"""Modality plug-ins: one registry; each turns shard members into batch tensors."""

from mmptm.modalities import image, labels, regions, text  # noqa: F401  (registers the plug-ins)
from mmptm.modalities.base import (
    DataContext,
    Modality,
    Need,
    build_modalities,
    merge_needs,
    view_prefix,
)

__all__ = ["DataContext", "Modality", "Need", "build_modalities", "merge_needs", "view_prefix"]
