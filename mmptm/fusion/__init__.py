"""Fusion modules: one registry; all return ``FusionOutput``."""

from mmptm.fusion.base import Fusion, FusionOutput, pool

__all__ = ["Fusion", "FusionOutput", "pool"]
