"""Models composed from encoders, fusion and objectives; checkpoints, loading, weight imports."""

from mmptm.models.pretrain import PretrainModel, PretrainOutput, data_transforms

__all__ = ["PretrainModel", "PretrainOutput", "data_transforms"]
