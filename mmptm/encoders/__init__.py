"""Encoders: one registry, one contract (``ModalityTokens`` at the fusion width)."""

from mmptm.encoders.base import Encoder, ModalityTokens, VocabInfo, init_weights

__all__ = ["Encoder", "ModalityTokens", "VocabInfo", "init_weights"]
