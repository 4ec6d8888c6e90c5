"""Objectives: one registry; each is a data side plus a loss side returning named tensors."""

from mmptm.objectives.base import ForObjectives, Objective, TaskSampler

__all__ = ["ForObjectives", "Objective", "TaskSampler"]
