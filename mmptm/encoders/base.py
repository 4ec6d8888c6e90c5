"""The one encoder contract: a modality's tokens at the fusion width, plus a mask.

Every encoder reads its own keys from the batch and returns ``ModalityTokens`` with a
modality-type embedding already added, so fusion never asks which modality it got.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import torch
from torch import nn

from mmptm.modalities.base import Need, view_prefix


class ModalityTokens(NamedTuple):
    """Tokens [B,N,D] at the fusion width and their mask [B,N] (True = real).

    ``targets`` [B,N,F] (optional): what an encoder with masked steps had at each step
    *before* its [MASK] replacement (wav2vec 2.0's local features for the quantiser, a
    spectrogram's frames for masked-frame prediction); None when it gives none.
    """

    tokens: torch.Tensor
    mask: torch.Tensor
    targets: torch.Tensor | None = None


@dataclass(frozen=True)
class VocabInfo:
    """What text parts need to know about the tokenizer (built from ``Tokenizer``)."""

    vocab_size: int
    pad_id: int = 0
    #: -1: the tokenizer has no mask token (CLIP's BPE), so no masked language modelling
    mask_id: int = 4
    cls_id: int = 2
    sep_id: int = 3
    special_ids: frozenset[int] = field(default_factory=frozenset)
    languages: tuple[str, ...] = ()
    #: text ids that begin a word (whole-word masking); empty when the tokenizer has no marks
    word_starts: frozenset[int] = field(default_factory=frozenset)
    #: padding reuses a text piece's id (CLIP's BPE pads with 0, the piece "!"), so its
    #: embedding row is no padding row: it keeps learning
    pad_is_text: bool = False
    #: each language's tag id (``[de]``), in ``languages`` order: what a decoder writing a
    #: translation starts from; empty when the tokenizer has none
    lang_tags: tuple[int, ...] = ()
    #: ids of pieces that end a sentence (".", "!", "?", "。"): mBART's sentence permutation
    sentence_ends: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def from_tokenizer(cls, tok) -> VocabInfo:
        tag = getattr(tok, "lang_tag_id", None)
        return cls(
            vocab_size=tok.vocab_size,
            pad_id=tok.pad_id,
            mask_id=tok.mask_id,
            cls_id=tok.cls_id,
            sep_id=tok.sep_id,
            special_ids=frozenset(tok.special_ids),
            languages=tuple(tok.languages),
            word_starts=tok.word_start_ids,
            pad_is_text=tok.pad_id not in tok.special_ids,
            lang_tags=tuple(tag(lang) for lang in tok.languages) if tag else (),
            sentence_ends=_sentence_ends(tok),
        )


def _sentence_ends(tok) -> frozenset[int]:
    """Ids of the tokenizer's pieces that end a sentence (none without ``id_to_piece``)."""
    piece = getattr(tok, "id_to_piece", None)
    if piece is None:
        return frozenset()
    specials = tok.special_ids
    return frozenset(
        i
        for i in range(tok.vocab_size)
        if i not in specials and piece(i).rstrip().endswith((".", "!", "?", "。"))
    )


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT-style initialisation for the modules mmptm defines (not for timm backbones)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class Encoder(nn.Module):
    """Base of all encoders: owns the modality-type embedding and declares the data it reads.

    An encoder reads the view named like itself (its recipe name) of its ``modality``: the
    plug-in's keys as they are when the names match (``input_ids``), else prefixed with
    ``<name>_`` (``text2_input_ids``). ``data_needs`` tells the data pipeline what to decode.
    """

    #: the modality plug-in whose keys this encoder reads
    modality: ClassVar[str] = ""
    #: the plug-in key whose presence in a batch means this encoder has input
    main_key: ClassVar[str] = ""

    def __init__(self, width: int, name: str = "") -> None:
        super().__init__()
        self.width = width
        self.view = name or self.modality
        self.prefix = view_prefix(self.modality, self.view)
        self.type_embedding = nn.Parameter(torch.zeros(width))

    @property
    def input_key(self) -> str:
        return self.prefix + self.main_key

    def has_input(self, batch: dict) -> bool:
        return self.input_key in batch

    def data_needs(self) -> dict[str, Need]:
        """What this encoder reads: ``{view: Need(modality, facts it fixes)}``."""
        return {self.view: Need(self.modality)}

    def add_type(self, tokens_BND: torch.Tensor) -> torch.Tensor:
        return tokens_BND + self.type_embedding
