"""Objectives: one registry; each is a data side plus a loss side returning named tensors."""

from mmptm.objectives import classification, contrastive, itm, mlm, regions, vqa  # noqa: F401  (registers the parts)
from mmptm.objectives.base import ForObjectives, Objective, TaskSampler

__all__ = ["ForObjectives", "Objective", "TaskSampler"]
