"""Encoders: one registry, one contract (``ModalityTokens`` at the fusion width)."""

from mmptm.encoders.base import Encoder, ModalityTokens, VocabInfo, init_weights
from mmptm.registry import import_all

__all__ = ["Encoder", "ModalityTokens", "VocabInfo", "init_weights"]

import_all(__name__, __path__)  # every module registers its parts
