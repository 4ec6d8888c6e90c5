"""Fusion modules: one registry; all return ``FusionOutput``."""

from mmptm.fusion.base import Fusion, FusionOutput, pool
from mmptm.registry import import_all

__all__ = ["Fusion", "FusionOutput", "pool"]

import_all(__name__, __path__)  # every module registers its parts
