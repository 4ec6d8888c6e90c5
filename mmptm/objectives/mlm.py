"""Masked language modelling (BERT, mBERT, XLM's MLM and TLM share it).

Data side: dynamic masking of ``mask_prob`` of the real, non-special tokens, replaced by
[MASK] / a random token / kept at 80/10/10. With ``mask_spans`` (a span annotation of the
text plug-in, e.g. the entity mentions ``entity``) each annotated span is also masked whole
with ``span_mask_prob``, as ERNIE 1.0's entity-level masking, and its own id (``<name>_ids``
at its first piece: an entity-aware fusion's aligned entity) is removed, so the span's words
must come from the context, not from the entity it names. With ``mask_phrases`` phrases are
masked whole as well, each with ``phrase_mask_prob`` (ERNIE 1.0's phrase-level masking): the
spans of a phrase annotation, or with ``"chunk"`` (for text that has none) the chunks of
:func:`chunk_words`. Loss side: a BERT transform head
with the output layer tied to the word embeddings, evaluated **only at masked positions**.
Legend: B batch, L tokens, D width, M masked positions, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import SWAPPED, Batch
from mmptm.encoders.base import VocabInfo, init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import view_prefix
from mmptm.modalities.text import SECOND_VIEW
from mmptm.objectives.base import Objective
from mmptm.objectives.masking import select_positions
from mmptm.objectives.modes import AttentionModes, check_fusion, mode_weights
from mmptm.registry import OBJECTIVES

IGNORE = -100


def mask_tokens(
    ids_BL: torch.Tensor,
    real_BL: torch.Tensor,
    g: torch.Generator,
    *,
    mask_prob: float,
    p_mask: float,
    p_random: float,
    mask_id: int,
    special_ids: torch.Tensor,
    random_pool: torch.Tensor,
    word_starts: torch.Tensor | None = None,
    also_BL: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (masked inputs, labels with IGNORE at unselected positions).

    ``also_BL``: positions selected besides the random draw (whole spans), then replaced by
    [MASK] / random / kept as the others.

    With ``word_starts`` (the ids of word-initial pieces) whole words are selected: a word
    is a word-initial piece, or any text piece that follows a non-text one, together with
    the continuation pieces after it; each word is selected with ``mask_prob``, and the
    [MASK]/random/keep choice is then made per piece, as in BERT's whole-word masking.
    """
    candidates = real_BL.bool() & ~torch.isin(ids_BL, special_ids)
    word_BL = None
    if word_starts is not None:
        after_text_BL = F.pad(candidates[:, :-1], (1, 0), value=False)
        starts_BL = candidates & (torch.isin(ids_BL, word_starts) | ~after_text_BL)
        word_BL = torch.cumsum(starts_BL.long(), dim=1)  # which word each piece belongs to
    selected = select_positions(candidates, mask_prob, g, groups_BN=word_BL)
    if also_BL is not None:
        selected = selected | (also_BL & candidates)
    labels = torch.where(selected, ids_BL, torch.full_like(ids_BL, IGNORE))
    r = torch.rand(ids_BL.shape, generator=g)
    to_mask = selected & (r < p_mask)
    to_random = selected & (r >= p_mask) & (r < p_mask + p_random)
    rand_ids = random_pool[torch.randint(len(random_pool), ids_BL.shape, generator=g)]
    inputs = torch.where(to_mask, torch.full_like(ids_BL, mask_id), ids_BL)
    inputs = torch.where(to_random, rand_ids, inputs)
    return inputs, labels


def chunk_words(
    ids_BL: torch.Tensor,
    candidates_BL: torch.Tensor,
    g: torch.Generator,
    *,
    word_starts: torch.Tensor,
    sentence_ends: torch.Tensor,
    words: int,
) -> torch.Tensor:
    """Long [B,L]: each piece's phrase under a simple chunker (ids in [0, L]; 0 also off-text).

    A stand-in for a lexical chunker where the text carries no phrase annotation: the words
    (as whole-word masking finds them) of each row are cut into chunks of ``words`` words,
    the first chunk of a row shortened by a random offset so the cuts fall anywhere, and a
    sentence end (a piece of ``sentence_ends``) always closes a chunk.
    """
    after_text_BL = F.pad(candidates_BL[:, :-1], (1, 0), value=False)
    starts_BL = candidates_BL & (torch.isin(ids_BL, word_starts) | ~after_text_BL)
    word_BL = torch.cumsum(starts_BL.long(), dim=1)  # 1-based index of each piece's word
    offset_B1 = torch.randint(words, (ids_BL.shape[0], 1), generator=g)
    ended_BL = F.pad(torch.isin(ids_BL, sentence_ends)[:, :-1], (1, 0), value=False)
    cut_BL = starts_BL & (((word_BL - 1 + offset_B1) % words == 0) | ended_BL)
    return torch.cumsum(cut_BL.long(), dim=1) * candidates_BL


@dataclass
class MaskTokens:
    """MLM data side over ``<prefix>input_ids``; writes ``<prefix>mlm_labels``.

    When ITM negatives are in the batch their text is masked like the rest (so masking
    gives ITM no hint) but carries no MLM labels where it is foreign: a caption is only
    predicted from its own image. When the negatives swapped only the second sentence of a
    joined pair (Oscar's polluted tags) that segment alone is foreign, and the caption keeps
    its labels (as Oscar's ``mask_loss_for_unmatched=False``).
    """

    data_priority: ClassVar[int] = 20

    prefix: str
    mask_prob: float
    p_mask: float
    p_random: float
    mask_id: int
    special_ids: torch.Tensor
    random_pool: torch.Tensor
    #: word-initial piece ids for whole-word masking; None masks pieces independently
    word_starts: torch.Tensor | None = None
    #: a span annotation masked whole with ``span_prob`` ("": none)
    span: str = ""
    span_prob: float = 0.0
    #: phrases masked whole with ``phrase_prob``: a span annotation, "chunk" (chunk_words
    #: over ``word_starts`` / ``sentence_ends``, ``phrase_words`` words), "": none
    phrase: str = ""
    phrase_prob: float = 0.0
    phrase_words: int = 3
    phrase_starts: torch.Tensor | None = None
    sentence_ends: torch.Tensor | None = None
    #: each row's attention mode drawn first (VLP's mix of bidirectional and seq2seq rows)
    modes: AttentionModes | None = None

    def _spans(self, batch: Batch, real_BL: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """The pieces of the spans drawn (each span with ``span_prob``); their ids removed."""
        ids_key, inside_key = f"{self.prefix}{self.span}_ids", f"{self.prefix}{self.span}_mask"
        if ids_key not in batch or inside_key not in batch:
            raise ValueError(
                f"mlm.mask_spans={self.span!r}: the batch has no {inside_key!r}; name a span "
                "annotation of data.modalities.text.spans (or the fusion's, e.g. ernie's entity)"
            )
        starts_BL = batch[ids_key] >= 0
        span_BL = torch.cumsum(starts_BL.long(), dim=1)  # which span each piece belongs to
        drawn_BL = select_positions(batch[inside_key] & real_BL, self.span_prob, g,
                                    groups_BN=span_BL)  # fmt: skip
        batch[ids_key] = batch[ids_key].masked_fill(drawn_BL & starts_BL, -1)
        return drawn_BL

    def _phrases(self, batch: Batch, real_BL: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """The pieces of the phrases drawn (each phrase with ``phrase_prob``)."""
        ids_BL = batch[f"{self.prefix}input_ids"]
        candidates_BL = real_BL & ~torch.isin(ids_BL, self.special_ids)
        if self.phrase == "chunk":
            assert self.phrase_starts is not None and self.sentence_ends is not None
            phrase_BL = chunk_words(
                ids_BL,
                candidates_BL,
                g,
                word_starts=self.phrase_starts,
                sentence_ends=self.sentence_ends,
                words=self.phrase_words,
            )
            return select_positions(candidates_BL, self.phrase_prob, g, groups_BN=phrase_BL)
        ids_key, inside_key = f"{self.prefix}{self.phrase}_ids", f"{self.prefix}{self.phrase}_mask"
        if ids_key not in batch or inside_key not in batch:
            raise ValueError(
                f"mlm.mask_phrases={self.phrase!r}: the batch has no {inside_key!r}; name a "
                "span annotation of data.modalities.text.spans, or 'chunk'"
            )
        phrase_BL = torch.cumsum((batch[ids_key] >= 0).long(), dim=1)  # each piece's phrase
        inside_BL = batch[inside_key] & candidates_BL
        return select_positions(inside_BL, self.phrase_prob, g, groups_BN=phrase_BL)

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        if self.modes is not None:
            batch = self.modes(batch, g)
        ids = batch[f"{self.prefix}input_ids"]
        real = batch.get(f"{self.prefix}attention_mask", torch.ones_like(ids, dtype=torch.bool))
        injected = batch.get(f"{self.prefix}injected_mask")
        if injected is not None:  # K-BERT's injected triples are never masked
            real = real & ~injected
        spans = self._spans(batch, real.bool(), g) if self.span else None
        if self.phrase:
            phrases = self._phrases(batch, real.bool(), g)
            spans = phrases if spans is None else spans | phrases
        inputs, labels = mask_tokens(
            ids,
            real,
            g,
            mask_prob=self.mask_prob,
            p_mask=self.p_mask,
            p_random=self.p_random,
            mask_id=self.mask_id,
            special_ids=self.special_ids,
            random_pool=self.random_pool,
            word_starts=self.word_starts,
            also_BL=spans,
        )
        if "itm_labels" in batch:
            foreign_BL = (batch["itm_labels"] == 0)[:, None].expand_as(labels)
            second = view_prefix("text", SECOND_VIEW)
            segments = batch.get(f"{self.prefix}segment_ids")
            swapped = batch.get(SWAPPED) or []
            if segments is not None and swapped and all(k.startswith(second) for k in swapped):
                foreign_BL = foreign_BL & (segments == 1)
            labels[foreign_BL] = IGNORE
        batch[f"{self.prefix}input_ids"] = inputs
        batch[f"{self.prefix}mlm_labels"] = labels
        return batch


def _check_phrases(cfg: MaskedLM.Config, vocab: VocabInfo) -> None:
    """One-line errors for ``mlm.mask_phrases`` and its settings."""
    if not cfg.mask_phrases:
        return
    if not 0.0 < cfg.phrase_mask_prob <= 1.0:
        raise ValueError(f"mlm.phrase_mask_prob must be in (0, 1], got {cfg.phrase_mask_prob}")
    if cfg.phrase_words < 1:
        raise ValueError(f"mlm.phrase_words must be >= 1, got {cfg.phrase_words}")
    if cfg.mask_phrases == cfg.mask_spans:
        raise ValueError(
            f"mlm.mask_phrases and mlm.mask_spans name the same annotation {cfg.mask_spans!r}"
        )


@OBJECTIVES.register("mlm")
class MaskedLM(Objective):
    """MLM head tied to the text encoder's word embeddings."""

    token_level: ClassVar[bool] = True

    @dataclass
    class Config:
        type: str = "mlm"
        weight: float = 1.0
        #: the text encoder (and hidden-state stream) this objective reads
        modality: str = "text"
        mask_prob: float = 0.15
        replace_with_mask: float = 0.8
        replace_with_random: float = 0.1
        #: select whole words (a word-initial sentencepiece piece and its continuations),
        #: so a masked word cannot be completed from its own other pieces
        whole_word: bool = False
        #: eps of the head's LayerNorm (BERT/XLM-R set it from their config)
        layer_norm_eps: float = 1e-12
        #: a span annotation of the text plug-in (``data.modalities.text.spans``, or a
        #: fusion's: ernie's ``entity``) whose spans are also masked whole, each with
        #: ``span_mask_prob``, their ids removed (ERNIE 1.0's entity masking); "": none
        mask_spans: str = ""
        span_mask_prob: float = 0.5
        #: ERNIE 1.0's phrase-level masking: phrases also masked whole, each with
        #: ``phrase_mask_prob`` (their ids kept): a span annotation of the text plug-in
        #: whose spans are phrases, or "chunk" for text without one (chunks of
        #: ``phrase_words`` words that never cross a sentence end; needs word-start marks);
        #: "": none
        mask_phrases: str = ""
        phrase_mask_prob: float = 0.15
        phrase_words: int = 3
        #: {mode: weight}: each row trains under an attention mode drawn by weight
        #: (bidirectional | seq2seq | causal), e.g. VLP's {bidirectional: 1, seq2seq: 1}: a
        #: seq2seq row predicts its masked pieces from the other modalities and its own past,
        #: which is how it then writes text; with seq2seq the closing [SEP] may be masked as
        #: well (UniLM), so that writing learns to stop. {} = the fusion's plain attention
        attention_modes: dict[str, float] = field(default_factory=dict)

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> MaskTokens:
        if not 0.0 < cfg.mask_prob < 1.0:
            raise ValueError(f"mlm.mask_prob must be in (0, 1), got {cfg.mask_prob}")
        if cfg.replace_with_mask + cfg.replace_with_random > 1.0:
            raise ValueError("mlm.replace_with_mask + replace_with_random must be <= 1")
        if vocab.mask_id < 0:
            raise ValueError(
                "mlm needs a tokenizer with a mask token; this one has none (CLIP's BPE)"
            )
        never = set(vocab.special_ids)
        if cfg.attention_modes.get("seq2seq", 0) > 0:
            # UniLM / VLP mask the closing [SEP] too: it is how a seq2seq row learns to stop
            never.discard(vocab.sep_id)
        specials = torch.tensor(sorted(never), dtype=torch.long)
        pool = torch.tensor(
            [i for i in range(vocab.vocab_size) if i not in vocab.special_ids], dtype=torch.long
        )
        if cfg.mask_spans and not 0.0 < cfg.span_mask_prob <= 1.0:
            raise ValueError(f"mlm.span_mask_prob must be in (0, 1], got {cfg.span_mask_prob}")
        _check_phrases(cfg, vocab)
        word_starts = None
        if cfg.whole_word or cfg.mask_phrases == "chunk":
            if not vocab.word_starts:
                raise ValueError(
                    f"mlm.{'whole_word' if cfg.whole_word else 'mask_phrases=chunk'} needs a "
                    "tokenizer whose pieces mark word starts (sentencepiece's '\u2581'); this "
                    "vocabulary has none"
                )
            word_starts = torch.tensor(sorted(vocab.word_starts), dtype=torch.long)
        return MaskTokens(
            prefix=view_prefix("text", cfg.modality),
            mask_prob=cfg.mask_prob,
            p_mask=cfg.replace_with_mask,
            p_random=cfg.replace_with_random,
            mask_id=vocab.mask_id,
            special_ids=specials,
            random_pool=pool,
            word_starts=word_starts if cfg.whole_word else None,
            span=cfg.mask_spans,
            span_prob=cfg.span_mask_prob,
            phrase=cfg.mask_phrases,
            phrase_prob=cfg.phrase_mask_prob,
            phrase_words=cfg.phrase_words,
            sentence_ends=torch.tensor(sorted(vocab.sentence_ends), dtype=torch.long),
            phrase_starts=word_starts if cfg.mask_phrases == "chunk" else None,
            modes=AttentionModes(
                mode_weights(cfg.attention_modes, "mlm.attention_modes"), cfg.modality
            )
            if cfg.attention_modes
            else None,
        )

    def __init__(
        self,
        cfg: Config,
        *,
        width: int,
        encoders: nn.ModuleDict,
        fusion: nn.Module | None = None,
        **_: object,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        if cfg.attention_modes:
            check_fusion(fusion, "mlm.attention_modes")
        if cfg.modality not in encoders or not hasattr(encoders[cfg.modality], "word"):
            raise ValueError(f"mlm.modality={cfg.modality!r} is not a text encoder of this model")
        # A list keeps the shared embedding out of this module's state dict (it is tied).
        self._word = [encoders[cfg.modality].word]
        vocab_size = self._word[0].num_embeddings
        self.transform = nn.Sequential(
            nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        )
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.prefix = view_prefix("text", cfg.modality)
        init_weights(self.transform)

    def logits(self, h_MD: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(h_MD), self._word[0].weight, self.bias)  # [M,V]

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        labels_BL = batch[f"{self.prefix}mlm_labels"]
        h_BLD = out.hidden[self.cfg.modality]
        sel_BL = labels_BL != IGNORE
        logits_MV = self.logits(h_BLD[sel_BL])
        target_M = labels_BL[sel_BL]
        # Sum / count rather than mean: a batch with nothing masked gives 0, not NaN.
        n = target_M.numel()
        loss = F.cross_entropy(logits_MV.float(), target_M, reduction="sum") / max(n, 1)
        acc = (logits_MV.argmax(-1) == target_M).float().sum() / max(n, 1)
        return {"loss": loss, "acc": acc.detach()}
