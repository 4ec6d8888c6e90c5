"""Models composed from encoders, fusion and objectives; a run's config, checkpoints, loading."""

from mmptm.models.pretrain import ModelConfig, PretrainModel, PretrainOutput, data_transforms

__all__ = ["ModelConfig", "PretrainModel", "PretrainOutput", "data_transforms"]
