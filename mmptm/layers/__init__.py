"""Building blocks shared by encoders and fusion modules."""

from mmptm.layers.attention import Attention, KVCache, key_padding_mask
from mmptm.layers.decoder import DecoderCache, TransformerDecoder
from mmptm.layers.transformer import TransformerBlock, TransformerConfig, TransformerStack

__all__ = [
    "Attention",
    "DecoderCache",
    "KVCache",
    "TransformerBlock",
    "TransformerConfig",
    "TransformerDecoder",
    "TransformerStack",
    "key_padding_mask",
]
