"""Text embeddings: word + position + segment (+ language), LayerNorm, dropout.

Each part but the word and position embeddings can be switched off (``segments: 0``,
``norm: false``): CLIP's text tower sums word and position embeddings and nothing else.

Contextualisation happens in the fusion module, so one text encoder serves single-stream,
two-stream and dual models alike. Batch keys:
``input_ids [B,L]``, ``attention_mask [B,L]``, and optional ``position_ids``,
``segment_ids``, ``lang_ids`` (TLM restarts positions and mixes languages per token).
A text encoder named other than ``text`` (a second view, e.g. the other sentence of a
parallel pair) reads the same keys prefixed with ``<name>_``.

``tag_classes`` (Oscar) makes the text view carry object tags: the encoder declares them to
the text plug-in, which appends each sample's detector labels, named by these classes, as
the second segment (``[CLS] caption [SEP] tags [SEP]``, BERT's pair layout: segment ids
0 / 1, positions running on). Declared here, not in the recipe's data settings, because the
tags are an input of the model: a fine-tuning run initialised from it reads them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from mmptm.encoders.base import Encoder, ModalityTokens, VocabInfo, init_weights
from mmptm.modalities.base import Need
from mmptm.registry import ENCODERS


@ENCODERS.register("text")
class TextEncoder(Encoder):
    """Embeds token ids at the fusion width; owns the word embeddings MLM heads tie to."""

    modality = "text"
    main_key = "input_ids"

    @dataclass
    class Config:
        type: str = "text"
        max_positions: int = 128
        segments: int = 2
        #: add a learned per-language embedding (XLM); needs ``lang_ids`` in the batch
        language_embeddings: bool = False
        dropout: float = 0.1
        #: LayerNorm over the summed embeddings (BERT); false = the sum as it is (CLIP)
        norm: bool = True
        layer_norm_eps: float = 1e-12
        #: added to every position id (XLM-R/RoBERTa count positions from padding_idx + 1 = 2)
        position_offset: int = 0
        #: share every embedding with this earlier text encoder (a second view of the same
        #: language model, e.g. the other side of a parallel pair); only the modality-type
        #: embedding stays its own
        tie_to: str = ""
        #: Oscar's object tags: the detector's class names by label id (module docstring);
        #: empty = captions only
        tag_classes: list[str] = field(default_factory=list)

    def __init__(
        self,
        cfg: Config,
        *,
        width: int,
        vocab: VocabInfo,
        name: str = "text",
        built: dict[str, nn.Module] | None = None,
        **_: object,
    ) -> None:
        super().__init__(width, name)
        self.cfg = cfg
        if cfg.tie_to:
            source = (built or {}).get(cfg.tie_to)
            if not isinstance(source, TextEncoder):
                raise ValueError(
                    f"encoder {name!r}: tie_to={cfg.tie_to!r} must name a text encoder listed "
                    f"before it (have: {sorted(built or {})})"
                )
            for part in ("word", "position", "segment", "language", "norm"):
                setattr(self, part, getattr(source, part))
            self.drop = nn.Dropout(cfg.dropout)
            self.cfg = source.cfg  # same shapes; keeps max_positions checks consistent
            return
        pad = None if vocab.pad_is_text else vocab.pad_id  # a text piece keeps learning
        self.word = nn.Embedding(vocab.vocab_size, width, padding_idx=pad)
        self.position = nn.Embedding(cfg.max_positions, width)
        self.segment = nn.Embedding(cfg.segments, width) if cfg.segments > 0 else None
        self.language: nn.Embedding | None = None
        if cfg.language_embeddings:
            if not vocab.languages:
                raise ValueError("language_embeddings=true but the tokenizer lists no languages")
            self.language = nn.Embedding(len(vocab.languages), width)
        self.norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps) if cfg.norm else nn.Identity()
        self.drop = nn.Dropout(cfg.dropout)
        init_weights(self)

    def data_needs(self) -> dict[str, Need]:
        if not self.cfg.tag_classes:
            return super().data_needs()
        facts = {"tag_classes": list(self.cfg.tag_classes), "restart_positions": False}
        return {self.view: Need(self.modality, facts)}

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.word

    def forward(self, batch: dict) -> ModalityTokens:
        p = self.prefix
        ids_BL = batch[f"{p}input_ids"]
        B, L = ids_BL.shape
        mask_BL = batch.get(f"{p}attention_mask")
        mask_BL = torch.ones_like(ids_BL, dtype=torch.bool) if mask_BL is None else mask_BL.bool()
        pos_BL = batch.get(f"{p}position_ids")
        # packed rows and joined pairs restart their positions: the largest one is what counts
        n = L if pos_BL is None else int(pos_BL.max()) + 1 if pos_BL.numel() else 0
        if pos_BL is None:
            pos_BL = torch.arange(L, device=ids_BL.device).expand(B, L)
        if n + self.cfg.position_offset > self.cfg.max_positions:
            raise ValueError(
                f"text of {n} positions (+ position_offset {self.cfg.position_offset}) exceeds "
                f"max_positions={self.cfg.max_positions} (raise model.encoders.<text>."
                "max_positions or lower data.modalities.text.max_len)"
            )
        x_BLD = self.word(ids_BL) + self.position(pos_BL + self.cfg.position_offset)
        if self.segment is not None:
            seg_BL = batch.get(f"{p}segment_ids")
            if seg_BL is None:
                seg_BL = torch.zeros_like(ids_BL)
            elif seg_BL.numel() and int(seg_BL.max()) >= self.cfg.segments:
                # an imported model with one segment embedding (XLM-R) fed BERT's pair layout
                raise ValueError(
                    f"segment id {int(seg_BL.max())} but the text encoder has "
                    f"{self.cfg.segments} segment embeddings (data.modalities.text.segments=1 "
                    "joins a pair in one segment)"
                )
            x_BLD = x_BLD + self.segment(seg_BL)
        if self.language is not None:
            x_BLD = x_BLD + self.language(batch[f"{p}lang_ids"])
        x_BLD = self.drop(self.norm(self.add_type(x_BLD)))
        return ModalityTokens(x_BLD, mask_BL)
