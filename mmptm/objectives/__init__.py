"""Objectives: one registry; each is a data side plus a loss side returning named tensors."""

from mmptm.objectives.base import ForObjectives, Objective, TaskSampler
from mmptm.registry import import_all

__all__ = ["ForObjectives", "Objective", "TaskSampler"]

import_all(__name__, __path__)  # every module registers its parts
