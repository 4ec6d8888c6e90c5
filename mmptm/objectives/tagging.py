"""Token tagging (fine-tuning): named entities in BIO tags (WikiANN), parts of speech (UD).

A sentence is its words joined by spaces (``txt``), and its ``json`` annotates each word as a
character span, the way the text plug-in reads spans (``mmptm.modalities.text``): ``words``
= ``[[start, end, i], ...]`` (the word's index) and ``tags`` = ``[[start, end, tag], ...]``
(the tag's name, looked up in the head's ``labels`` vocabulary; ``mmptm data conll`` /
``conllu`` write both). The head declares both spans and the vocabulary, so a recipe need
not. The text plug-in then marks each word's **first piece** with its index (``word_ids``)
and its tag row (``tag_ids``) and leaves -1 on the others: the first sub-piece of a word
carries its label and the other pieces none, as XTREME fine-tunes (Hu et al. 2020).

Head: dropout → linear → one logit per tag at every piece; cross-entropy over the first
pieces (a word whose tag the vocabulary lacks gives no loss). A word's prediction is the
argmax at its first piece; :mod:`mmptm.eval.tagging` scores whole sentences (seqeval's span
F1 for BIO tags, accuracy otherwise).

Legend: B batch, L pieces, D width, C tags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need, view_prefix
from mmptm.modalities.labels import read_labels
from mmptm.objectives.base import Objective
from mmptm.registry import OBJECTIVES

#: how a tag set is scored: ``bio``: entity spans (seqeval's F1); ``tags``: per-word accuracy
SCHEMES = ("auto", "bio", "tags")
#: the chunk prefixes seqeval reads (IOB1/IOB2, IOBES)
_CHUNK_PREFIXES = ("B-", "I-", "E-", "S-")
#: the batch names of the two span annotations (``word_ids``, ``tag_ids`` ...)
WORD, TAG = "word", "tag"


def is_bio(labels: Sequence[str]) -> bool:
    """Whether a tag set is entity chunks: every tag "O" or B-/I-/E-/S- plus a type."""
    return any(t != "O" for t in labels) and all(
        t == "O" or (t[:2] in _CHUNK_PREFIXES and len(t) > 2) for t in labels
    )


@OBJECTIVES.register("token_tagging")
class TokenTagging(Objective):
    """A tag per word from its first piece (module docstring)."""

    @dataclass
    class Config:
        type: str = "token_tagging"
        weight: float = 1.0
        #: the tag vocabulary (``labels.txt`` of ``mmptm data conll|conllu``'s train split)
        labels: str = ""
        #: the text view and hidden-state stream it reads
        modality: str = "text"
        #: json fields of the word spans (``[[start, end, index]]``) and the tag spans
        words: str = "words"
        tags: str = "tags"
        dropout: float = 0.1
        #: ``auto``: ``bio`` when every tag is O or B-/I-/E-/S-TYPE, else ``tags``
        scheme: str = "auto"

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        if not cfg.labels:
            raise ValueError("token_tagging.labels is empty: give the tag vocabulary file")
        if cfg.scheme not in SCHEMES:
            raise ValueError(f"token_tagging.scheme must be one of {SCHEMES}, got {cfg.scheme!r}")
        self.cfg = cfg
        self.labels = read_labels(cfg.labels)
        if len(self.labels) < 2:
            raise ValueError(f"{cfg.labels}: a tagger needs at least 2 tags")
        if cfg.scheme == "bio" and not is_bio(self.labels):
            raise ValueError(
                f"token_tagging.scheme=bio, but {cfg.labels} has tags that are neither O nor "
                "B-/I-/E-/S-TYPE (scheme: tags scores them by accuracy)"
            )
        self.scheme = cfg.scheme if cfg.scheme != "auto" else (
            "bio" if is_bio(self.labels) else "tags"
        )  # fmt: skip
        self.prefix = view_prefix("text", cfg.modality)
        self.head = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(width, len(self.labels)))
        init_weights(self)

    def data_needs(self) -> dict[str, Need]:
        spans = {WORD: self.cfg.words, TAG: self.cfg.tags}
        return {
            self.cfg.modality: Need(
                "text", {"spans": spans, "span_vocabularies": {TAG: self.cfg.labels}}
            )
        }

    def logits(self, out: FusionOutput) -> torch.Tensor:
        """Tag logits at every piece [B,L,C]."""
        return self.head(out.hidden[self.cfg.modality]).float()

    def word_predictions(
        self, out: FusionOutput, batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(row, word index, predicted tag row) of every word whose first piece is in the
        batch, each [N]: words cut off by truncation are not."""
        word_BL = batch[f"{self.prefix}{WORD}_ids"]
        rows_N, cols_N = (word_BL >= 0).nonzero(as_tuple=True)
        pred_BL = self.logits(out).argmax(-1)
        return rows_N, word_BL[rows_N, cols_N], pred_BL[rows_N, cols_N]

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        tag_BL = batch[f"{self.prefix}{TAG}_ids"]
        first_BL = tag_BL >= 0  # a word's first piece, its tag known
        logits_NC = self.logits(out)[first_BL]
        target_N = tag_BL[first_BL]
        n = max(int(target_N.numel()), 1)
        loss = F.cross_entropy(logits_NC, target_N, reduction="sum") / n  # 0, not NaN, if none
        acc = (logits_NC.argmax(-1) == target_N).float().sum() / n
        return {"loss": loss, "acc": acc.detach()}


__all__ = ["SCHEMES", "TAG", "WORD", "TokenTagging", "is_bio"]
