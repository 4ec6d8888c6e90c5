"""KnowBERT's candidate mentions (Peters et al., 2019): ``json.candidates`` → span tensors.

``mmptm data candidates`` writes, offline, each text sample's candidate spans over its
``txt`` member: ``[[start, end, [entity, ...], [prior, ...], gold], ...]`` (characters, end
exclusive; ``gold`` the index of the gold entity among the candidates, -1 none). This
plug-in, declared by the ``knowbert`` fusion with the entity table's id list, maps them
through the tokenizer's offsets to the text view's pieces (``[CLS]`` is piece 0) and writes

- ``candidate_spans [B,M,2]``: first and last piece of each span (-1: padding),
- ``candidate_ids [B,M,C]``: rows of the entity table (-1: padding; ids the id list lacks
  are dropped, and so is a gold entity among them),
- ``candidate_priors [B,M,C]``: p(e | alias), 0 on padding,
- ``candidate_gold [B,M]``: the gold candidate's index (-1: none),
- ``candidate_mask [B,M]``: True on real spans.

M and C are the batch's largest (at least 1). A span that covers no piece, or whose pieces
the text view's ``max_len`` cuts off (the batch stage :class:`DropTruncated`, from the
view's lengths), is dropped and counted (:attr:`CandidatesData.dropped`, logged at 1, 10,
100...). A sample without the field has no spans (a source without candidates).

Spans are found on the unmasked text, so after masking (:class:`DropMasked`, on by
``drop_masked``) a span with a piece masked LM predicts is dropped too, counted the same way:
its candidates would name the masked answer's entity.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from mmptm.batch import Batch
from mmptm.modalities.base import Modality, Sample, read_id_list, view_prefix
from mmptm.registry import MODALITIES

log = logging.getLogger(__name__)

KEYS = ("candidate_spans", "candidate_ids", "candidate_priors", "candidate_gold", "candidate_mask")


def _count(counter: Counter[str], why: str, n: int) -> None:
    """Add ``n`` dropped spans; log at 1, 10, 100, ... of a kind."""
    before = counter[why]
    counter[why] += n
    if n and (before == 0 or len(str(before)) != len(str(before + n))):
        log.warning("candidate spans dropped so far (%s): %d", why, counter[why])


def piece_span(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """(first, last) piece, counted from ``[CLS]`` = 0, of the pieces the characters
    ``[start, end)`` overlap; (-1, -1) when none does."""
    covered = [t for t, (a, b) in enumerate(offsets) if a < b and a < end and b > start]
    return (covered[0] + 1, covered[-1] + 1) if covered else (-1, -1)


def _drop(batch: Batch, drop_BM: torch.Tensor) -> None:
    """Turn the spans of ``drop_BM`` into padding (no candidates, no gold)."""
    batch["candidate_spans"] = batch["candidate_spans"].masked_fill(drop_BM[..., None], -1)
    batch["candidate_ids"] = batch["candidate_ids"].masked_fill(drop_BM[..., None], -1)
    batch["candidate_priors"] = batch["candidate_priors"].masked_fill(drop_BM[..., None], 0.0)
    batch["candidate_gold"] = batch["candidate_gold"].masked_fill(drop_BM, -1)
    batch["candidate_mask"] = batch["candidate_mask"] & ~drop_BM


@dataclass
class _DropSpans:
    """A batch stage that turns some candidate spans into padding and counts them by
    ``reason``; subclasses say which spans (``which``: [B,M] or None when the batch lacks
    what it needs)."""

    reason: ClassVar[str] = ""

    text_prefix: str
    dropped: Counter[str] = field(default_factory=Counter)

    def which(self, batch: Batch) -> torch.Tensor | None:
        raise NotImplementedError

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        if batch.get("candidate_spans") is None:
            return batch
        drop_BM = self.which(batch)
        if drop_BM is None:
            return batch
        drop_BM = drop_BM & batch["candidate_mask"]
        n = int(drop_BM.sum())
        if n:
            _count(self.dropped, self.reason, n)
            _drop(batch, drop_BM)
        return batch


@dataclass
class DropTruncated(_DropSpans):
    """The batch stage that drops spans whose pieces the text view's ``max_len`` cut off
    (priority 14: before pair packing and masking)."""

    data_priority: ClassVar[int] = 14
    reason: ClassVar[str] = "cut off by max_len"

    def which(self, batch: Batch) -> torch.Tensor | None:
        real_BL = batch.get(f"{self.text_prefix}attention_mask")
        if real_BL is None:
            return None
        last_B = real_BL.sum(1) - 2  # the last real piece before [SEP]
        return batch["candidate_spans"][..., 1] > last_B[:, None]


@dataclass
class DropMasked(_DropSpans):
    """The batch stage that drops spans a piece of which masked LM predicts (priority 21:
    after masking, 20). Spans are found on the unmasked text, so a masked name would still
    bring its own entity's candidates, and the model learns to read the answer off them
    (the knowledge study's cloze: 78.9% P@1 with the answer's span, 14.4% without)."""

    data_priority: ClassVar[int] = 21
    reason: ClassVar[str] = "masked for prediction"

    def which(self, batch: Batch) -> torch.Tensor | None:
        labels_BL = batch.get(f"{self.text_prefix}mlm_labels")
        if labels_BL is None:
            return None
        spans_BM2 = batch["candidate_spans"]
        target_BL = labels_BL >= 0  # masked LM's ignored positions are negative
        # pieces predicted up to each position: a span holds one iff the count rises across it
        seen_BL = torch.nn.functional.pad(target_BL.long().cumsum(1), (1, 0))
        first_BM = spans_BM2[..., 0].clamp(min=0)
        last_BM = spans_BM2[..., 1].clamp(min=0)
        return seen_BL.gather(1, last_BM + 1) > seen_BL.gather(1, first_BM)


@MODALITIES.register("candidates")
class CandidatesData(Modality):
    """A text sample's candidate mention spans and their entities (module docstring)."""

    members: ClassVar[tuple[str, ...]] = ("txt", "json")
    keys: ClassVar[tuple[str, ...]] = KEYS

    @dataclass
    class Config:
        type: str = "candidates"
        #: the json field ``mmptm data candidates`` wrote
        field: str = "candidates"
        #: the text view the spans index (its ``max_len`` truncation drops spans)
        text_view: str = "text"
        #: id list whose rows the entity ids become (the entity table's); "" = integer ids
        entities: str = ""
        #: candidates per span kept, best prior first (KnowBERT: 30)
        max_candidates: int = 30
        #: drop a span when masked LM predicts one of its pieces (else the candidates name
        #: the masked answer's entity)
        drop_masked: bool = True

    def __init__(self, cfg: Config, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        if self.context.tokenizer is None:
            raise ValueError("the candidates modality needs a tokenizer (data.tokenizer)")
        if cfg.max_candidates < 1:
            raise ValueError(
                f"data.modalities.candidates.max_candidates must be >= 1, got {cfg.max_candidates}"
            )
        if self.context.pack:
            raise ValueError(
                f"data.sources {sorted(self.context.pack)} pack rows; candidate spans index "
                "one sentence per row (turn packing off)"
            )
        self.rows = read_id_list(cfg.entities) if cfg.entities else None
        prefix = view_prefix("text", cfg.text_view)
        #: spans dropped in this process, by why (the stages' counts are their worker's)
        self.dropped: Counter[str] = Counter()
        self.stages = [DropTruncated(prefix, self.dropped)]
        if cfg.drop_masked:
            self.stages.append(DropMasked(prefix, self.dropped))

    def _row(self, entity: Any) -> int:
        """The table row of an entity id (-1: unknown to the id list)."""
        if self.rows is not None and isinstance(entity, str):
            return self.rows.get(entity, -1)
        if isinstance(entity, int) and not isinstance(entity, bool) and entity >= 0:
            return entity
        raise ValueError(
            f"candidate entity {entity!r} is not an id of {self.cfg.entities or 'a list'}"
        )

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        found = meta.get(self.cfg.field)
        spans: list[tuple[int, int, list[int], list[float], int]] = []
        if found is not None:
            if "txt" not in sample:
                raise ValueError(f"json {self.cfg.field!r} annotates the txt member; none here")
            text = sample["txt"].decode("utf-8")
            _, offsets = self.context.tokenizer.encode_with_offsets(text)
            if not isinstance(found, list):
                raise ValueError(f"json {self.cfg.field!r} must be a list of spans")
            for span in found:
                one = self._span(span, offsets, len(text))
                if one is not None:
                    spans.append(one)
        return {"candidates": spans}

    def _span(
        self, span: Any, offsets: Sequence[tuple[int, int]], n_chars: int
    ) -> tuple[int, int, list[int], list[float], int] | None:
        """One span in pieces with its rows, priors and gold; None when it covers no piece."""
        ok = isinstance(span, list) and len(span) == 5 and isinstance(span[2], list)
        ok = ok and isinstance(span[3], list) and len(span[2]) == len(span[3])
        if not ok or not 0 <= span[0] < span[1] <= n_chars:
            raise ValueError(
                f"candidate span {str(span)[:80]} is not [start, end, [ids], [priors], gold] "
                f"within the text ({n_chars} characters)"
            )
        start, end, ids, priors, gold = span
        first, last = piece_span(offsets, start, end)
        if first < 0:
            _count(self.dropped, "no piece", 1)
            return None
        kept = [(i, self._row(e), float(p)) for i, (e, p) in enumerate(zip(ids, priors))]
        kept = [k for k in kept if k[1] >= 0][: self.cfg.max_candidates]
        new_gold = next((j for j, k in enumerate(kept) if k[0] == gold), -1)
        return first, last, [k[1] for k in kept], [k[2] for k in kept], new_gold

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        per = [s["candidates"] for s in samples]
        B = len(per)
        M = max(1, *(len(p) for p in per))
        C = max(1, *(len(c[2]) for p in per for c in p)) if any(per) else 1
        out = {
            "candidate_spans": torch.full((B, M, 2), -1, dtype=torch.long),
            "candidate_ids": torch.full((B, M, C), -1, dtype=torch.long),
            "candidate_priors": torch.zeros(B, M, C),
            "candidate_gold": torch.full((B, M), -1, dtype=torch.long),
            "candidate_mask": torch.zeros(B, M, dtype=torch.bool),
        }
        for b, spans in enumerate(per):
            for m, (first, last, rows, priors, gold) in enumerate(spans):
                out["candidate_spans"][b, m] = torch.tensor([first, last])
                out["candidate_ids"][b, m, : len(rows)] = torch.tensor(rows, dtype=torch.long)
                out["candidate_priors"][b, m, : len(priors)] = torch.tensor(priors)
                out["candidate_gold"][b, m] = gold
                out["candidate_mask"][b, m] = True
        return out

    def transforms(self) -> list[Any]:
        return list(self.stages)
