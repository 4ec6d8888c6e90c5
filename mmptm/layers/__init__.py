"""Building blocks shared by encoders and fusion modules."""

from mmptm.layers.attention import Attention, key_padding_mask
from mmptm.layers.transformer import TransformerBlock, TransformerConfig, TransformerStack

__all__ = [
    "Attention",
    "TransformerBlock",
    "TransformerConfig",
    "TransformerStack",
    "key_padding_mask",
]
