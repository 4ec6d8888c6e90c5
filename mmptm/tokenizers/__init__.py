"""Tokenizers: multilingual sentencepiece (trained by ``mmptm tokenizer train``) and CLIP's BPE
(imported OpenCLIP runs). :func:`load_tokenizer` picks the kind from the file."""

from mmptm.tokenizers.clip import ClipTokenizer
from mmptm.tokenizers.sentencepiece import Tokenizer, load_tokenizer, train_tokenizer

__all__ = ["ClipTokenizer", "Tokenizer", "load_tokenizer", "train_tokenizer"]
