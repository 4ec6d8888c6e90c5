"""Modality plug-ins: one registry; each module here registers the plug-ins it defines."""

from mmptm.modalities.base import (
    DataContext,
    Modality,
    Need,
    build_modalities,
    merge_needs,
    view_prefix,
)

__all__ = ["DataContext", "Modality", "Need", "build_modalities", "merge_needs", "view_prefix"]
