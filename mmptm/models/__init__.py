"""Models composed from encoders, fusion and objectives."""

from mmptm.models.pretrain import ModelConfig, PretrainModel, PretrainOutput, data_transforms

__all__ = ["ModelConfig", "PretrainModel", "PretrainOutput", "data_transforms"]
