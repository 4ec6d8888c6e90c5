"""Extractive question answering (fine-tuning): a start and an end logit per piece of the
context, long contexts cut into overlapping windows (SQuAD, XQuAD, MLQA, TyDiQA-GoldP).

A sample is a text pair as an NLI one (``json.premise`` = the question, ``json.hypothesis`` =
the context; ``mmptm data squad`` writes them) with two span annotations on the context, as
the text plug-in reads them (:mod:`mmptm.modalities.text`): ``answer`` = ``{"hypothesis":
[[start, end, 0]]}`` (the first gold answer: the training target; none for a question without
one) and ``context_span`` = ``{"hypothesis": [[0, len(context), 0]]}`` (marks every context
piece, which is where an answer may start and end). The head declares both, so a recipe need
not; the recipe's ``data.modalities.text.max_len`` bounds the question and the whole context,
the head's ``max_len`` the model's rows.

**Doc stride** (BERT's run_squad, as XTREME): :class:`DocStride`, the head's data side, runs
before the pair is joined into one row. The question keeps ``max_query_len`` pieces; the
context is cut into windows of ``max_len`` - (question) - 2 pieces whose starts are
``stride`` pieces apart (the last window ends at the context's end), and each window becomes
a row ``[CLS] question [SEP] window [SEP]`` with every per-sample value repeated (``__key__``
too). A row whose window holds the whole answer is trained to point at its first and last
piece; any other row at [CLS] (position 0), as in BERT's SQuAD fine-tuning. Rows carry
``qa_offset [R]`` (the window's first context piece), ``qa_length [R]`` (its pieces: they
are the row's last real pieces before the closing [SEP], whatever the pair layout) and
``qa_complete [R]``.

Head: dropout → linear → (start, end) logits per position, padding excluded; loss = the mean
of the start and end cross-entropies. :meth:`ExtractiveQA.best_spans` picks a row's answer:
the highest start + end logit over context pieces with start <= end < start +
``max_answer_len`` (exactly, not from the n best starts and ends); :mod:`mmptm.eval.qa` takes
the best row of each question and scores the text with SQuAD's EM and F1.

Legend: B samples, R rows (windows), L pieces, D width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import VocabInfo, init_weights
from mmptm.fusion.base import FusionOutput
from mmptm.modalities.base import Need, view_prefix
from mmptm.modalities.text import SECOND_VIEW
from mmptm.objectives.base import Objective
from mmptm.registry import OBJECTIVES

#: batch names of the two span annotations (``qa_answer_mask``, ``qa_context_mask`` ...)
ANSWER, CONTEXT = "qa_answer", "qa_context"
#: the key prefix of a pair's second sentence before the pair is joined ("text2_")
SECOND = view_prefix("text", SECOND_VIEW)
_NEG = -1e4  # a logit no real position reaches (bf16-safe)


def windows(n: int, size: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of the windows over ``n`` pieces, BERT's run_squad rule: a window of
    up to ``size`` pieces every ``stride`` pieces until one reaches the end."""
    out, start = [], 0
    while True:
        length = min(n - start, size)
        out.append((start, length))
        if start + length >= n:
            return out
        start += min(length, stride)


@dataclass
class DocStride:
    """The head's data side: question + context windows as separate rows (module docstring)."""

    data_priority: ClassVar[int] = 12  # before the pair is joined (15)

    max_len: int
    stride: int
    max_query_len: int
    #: key prefix of the question's view ("" for ``text``)
    first: str = ""
    #: the tokenizer's padding id (``input_ids`` of a padded row)
    pad_id: int = 0

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        q, c = self.first, SECOND
        if f"{c}input_ids" not in batch:
            return batch
        names = [k[len(c) :] for k in batch if k.startswith(c)]  # the per-token keys
        q_real = batch[f"{q}attention_mask"].sum(1).tolist()
        c_real = batch[f"{c}attention_mask"].sum(1).tolist()
        rows, q_cols, c_cols, offsets, lengths = [], [], [], [], []
        for b, (nq_all, nc) in enumerate(zip(q_real, c_real)):
            nq = min(nq_all, self.max_query_len)
            size = self.max_len - nq - 2  # the rest of a row: [CLS] q [SEP] .. [SEP]
            keep_q = [*range(nq - 1), nq_all - 1]  # [CLS], the first pieces, its [SEP]
            for start, length in windows(nc - 2, size, self.stride):
                rows.append(b)
                q_cols.append(keep_q)
                c_cols.append([0, *range(1 + start, 1 + start + length), nc - 1])
                offsets.append(start)
                lengths.append(length)
        index_R = torch.tensor(rows)
        token_keys = {f"{p}{n}" for p in (q, c) for n in names}
        B = len(q_real)
        out = {k: _repeat(v, index_R, B) for k, v in batch.items() if k not in token_keys}
        for p, cols in ((q, q_cols), (c, c_cols)):
            for n in names:
                out[f"{p}{n}"] = _gather_rows(batch[f"{p}{n}"], index_R, cols, self._fill(n))
        total_R = batch[f"{c}{ANSWER}_mask"].sum(1)[index_R]
        out["qa_complete"] = (total_R > 0) & (out[f"{c}{ANSWER}_mask"].sum(1) == total_R)
        out["qa_offset"] = torch.tensor(offsets)
        out["qa_length"] = torch.tensor(lengths)
        return out

    def _fill(self, name: str) -> int | bool:
        """The padding of a per-token key, as the text plug-in pads it."""
        if name == "input_ids":
            return self.pad_id
        if name.endswith("_mask"):
            return False
        return 0 if name in ("segment_ids", "lang_ids") else -1  # span values: -1


def _repeat(value: Any, index_R: torch.Tensor, B: int) -> Any:
    """A batch value with one entry per row: per-sample tensors and the per-sample lists
    (``__key__``, ``__record__``) repeated for each of the sample's rows."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == B:
        return value[index_R]
    if isinstance(value, list) and len(value) == B:
        return [value[i] for i in index_R.tolist()]
    return value


def _gather_rows(
    t_BL: torch.Tensor, index_R: torch.Tensor, cols: list[list[int]], fill: int | bool
) -> torch.Tensor:
    """Rows ``t_BL[index_R[r], cols[r]]``, right-padded with ``fill``."""
    width = max(map(len, cols))
    col_RL = torch.zeros(len(cols), width, dtype=torch.long)
    real_RL = torch.zeros(len(cols), width, dtype=torch.bool)
    for r, cs in enumerate(cols):
        col_RL[r, : len(cs)] = torch.tensor(cs)
        real_RL[r, : len(cs)] = True
    return t_BL[index_R[:, None], col_RL].masked_fill(~real_RL, fill)


@OBJECTIVES.register("extractive_qa")
class ExtractiveQA(Objective):
    """Start / end logits over the context pieces of each window (module docstring)."""

    @dataclass
    class Config:
        type: str = "extractive_qa"
        weight: float = 1.0
        #: the text view and hidden-state stream it reads
        modality: str = "text"
        #: json fields of the answer's span and the context's span (module docstring)
        answer: str = "answer"
        context: str = "context_span"
        #: pieces per row: [CLS] question [SEP] window [SEP] (BERT's max_seq_length)
        max_len: int = 384
        #: pieces between the starts of two windows of a context (BERT's doc_stride)
        stride: int = 128
        #: question pieces kept, [CLS] and [SEP] included
        max_query_len: int = 64
        #: an answer spans at most this many pieces
        max_answer_len: int = 30
        dropout: float = 0.1
        #: the evaluation's answer normalisation: squad (evaluate-v1.1.py) or mlqa (by the
        #: answer's language, mlqa_evaluation_v1.py; mmptm.eval.qa)
        metric: Literal["squad", "mlqa"] = "squad"

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        _check(cfg)
        self.cfg = cfg
        self.prefix = view_prefix("text", cfg.modality)
        self.head = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(width, 2))
        init_weights(self)

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo, **_: object) -> DocStride:
        _check(cfg)
        return DocStride(cfg.max_len, cfg.stride, cfg.max_query_len,
                         view_prefix("text", cfg.modality), vocab.pad_id)  # fmt: skip

    def data_needs(self) -> dict[str, Need]:
        spans = {ANSWER: self.cfg.answer, CONTEXT: self.cfg.context}
        return {self.cfg.modality: Need("text", {"spans": spans})}

    def logits(self, out: FusionOutput, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits [R,L], padding at a large negative value."""
        both_RL2 = self.head(out.hidden[self.cfg.modality]).float()
        real_RL = batch[f"{self.prefix}attention_mask"]
        start_RL, end_RL = both_RL2.masked_fill(~real_RL[..., None], _NEG).unbind(-1)
        return start_RL, end_RL

    def targets(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Gold start and end positions [R]: the answer's first and last piece in a row that
        holds all of it, else 0 ([CLS])."""
        ans_RL = batch[f"{self.prefix}{ANSWER}_mask"]
        L = ans_RL.shape[1]
        pos_L = torch.arange(L, device=ans_RL.device)
        first_R = torch.where(ans_RL, pos_L, L).amin(1)
        last_R = torch.where(ans_RL, pos_L, -1).amax(1)
        ok_R = batch["qa_complete"].to(ans_RL.device)
        return torch.where(ok_R, first_R, 0), torch.where(ok_R, last_R, 0)

    def best_spans(
        self, start_RL: torch.Tensor, end_RL: torch.Tensor, batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row: the best (score, first, last) context pieces, as indices into the whole
        context (the window's offset added); score -inf for a row without context."""
        ctx_RL = batch[f"{self.prefix}{CONTEXT}_mask"]
        R, L = ctx_RL.shape
        score_RLL = start_RL[:, :, None] + end_RL[:, None, :]  # [R, start, end]
        pos_L = torch.arange(L, device=ctx_RL.device)
        gap_LL = pos_L[None, :] - pos_L[:, None]
        ok_RLL = ctx_RL[:, :, None] & ctx_RL[:, None, :]
        ok_RLL &= ((gap_LL >= 0) & (gap_LL < self.cfg.max_answer_len))[None]
        score_RLL = score_RLL.masked_fill(~ok_RLL, float("-inf"))
        best_R, at_R = score_RLL.view(R, L * L).max(1)
        first_R, last_R = at_R // L, at_R % L
        # the window is the row's last qa_length real pieces before its closing [SEP]
        real_R = batch[f"{self.prefix}attention_mask"].sum(1)
        first_pos_R = real_R - 1 - batch["qa_length"].to(real_R.device)
        shift_R = batch["qa_offset"].to(real_R.device) - first_pos_R
        return best_R, first_R + shift_R, last_R + shift_R

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        start_RL, end_RL = self.logits(out, batch)
        gold_start_R, gold_end_R = self.targets(batch)
        loss = (F.cross_entropy(start_RL, gold_start_R) + F.cross_entropy(end_RL, gold_end_R)) / 2
        right = (start_RL.argmax(-1) == gold_start_R) & (end_RL.argmax(-1) == gold_end_R)
        return {"loss": loss, "acc": right.float().mean().detach()}


def _check(cfg: ExtractiveQA.Config) -> None:
    where = "extractive_qa"
    for key in ("max_len", "stride", "max_query_len", "max_answer_len"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"{where}.{key} must be >= 1, got {getattr(cfg, key)}")
    if cfg.max_query_len < 3 or cfg.max_query_len + 3 > cfg.max_len:
        raise ValueError(
            f"{where}.max_query_len={cfg.max_query_len} must be >= 3 and leave room for a "
            f"context piece in max_len={cfg.max_len}"
        )


__all__ = ["ANSWER", "CONTEXT", "DocStride", "ExtractiveQA", "windows"]
