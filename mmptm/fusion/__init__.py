"""Fusion modules: one registry; all return ``FusionOutput``."""

from mmptm.fusion import dual, single_stream, two_stream  # noqa: F401  (registers the parts)
from mmptm.fusion.base import Fusion, FusionOutput, pool

__all__ = ["Fusion", "FusionOutput", "pool"]
