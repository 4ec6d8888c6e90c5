"""KnowBERT (Peters et al., 2019): ``single_stream``'s stack with knowledge attention and
recontextualisation (KAR) inserted after chosen layers.

The stack keeps ``single_stream``'s parameter names (``stack.*``, ``pooler.*``), so a BERT
(or any text run's) weights load into it, as KnowBERT starts from BERT. After each layer of
``kar_after`` (counted from 1: KnowBERT-Wiki ``[10]`` of BERT-base's 12; KnowBERT-W+W
``[10, 11]``, one KAR per knowledge base, here both reading the one entity table) a
:class:`~mmptm.layers.kar.KnowledgeAttention` links the sample's candidate mention spans
(the ``candidates`` plug-in, which this fusion declares with the table's id list) to entity
vectors and folds them back into the word states. Entity vectors come from the frozen
:class:`~mmptm.encoders.entities.EntityTable` (``entities:``, as ERNIE's: TransE / TuckER
vectors of ``mmptm kg train-embeddings``). Each KAR's linker scores travel in
:class:`KnowBertOutput` ``.link`` for the ``linking`` objective.
``knowledge: false`` keeps the architecture and gives every KAR no spans (the "without the
graph" baseline: only the null key is attended to).

Legend: B batch, N tokens (all modalities), D width, M candidate spans, C candidates per span.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import ModalityTokens
from mmptm.encoders.entities import EntityTable, EntityTableConfig
from mmptm.fusion.base import FusionOutput, join_tokens, split_joint
from mmptm.fusion.single_stream import SingleStreamFusion
from mmptm.layers.kar import KnowledgeAttention
from mmptm.modalities.base import Need
from mmptm.registry import FUSIONS


@dataclass
class KnowBertOutput(FusionOutput):
    """``FusionOutput`` plus each KAR's linker scores ``link[layer]`` [B,M,C] (-inf where no
    candidate)."""

    link: dict[int, torch.Tensor] = field(default_factory=dict)


@FUSIONS.register("knowbert")
class KnowBertFusion(SingleStreamFusion):
    """A single-stream stack with KAR after the layers of ``kar_after`` (module docstring)."""

    @dataclass
    class Config(SingleStreamFusion.Config):
        type: str = "knowbert"
        #: the layers (1-based) a KAR follows: KnowBERT-Wiki [10], W+W [10, 11]
        kar_after: list[int] = field(default_factory=lambda: [1])
        #: the entity width KAR works at (KnowBERT-Wiki: 300, WordNet's TuckER: 200)
        entity_dim: int = 100
        kar_heads: int = 4
        entities: EntityTableConfig = field(default_factory=EntityTableConfig)
        #: the json field of ``mmptm data candidates``
        candidates: str = "candidates"
        #: candidates per span (KnowBERT: 30)
        max_candidates: int = 30
        #: false: no spans reach KAR (the without-graph baseline)
        knowledge: bool = True

    cfg: Config

    def __init__(
        self,
        cfg: Config,
        *,
        width: int,
        encoders: nn.ModuleDict | None = None,
        **kw: object,
    ) -> None:
        _check(cfg)
        super().__init__(cfg, width=width, **kw)
        texts = [n for n, e in (encoders or {}).items() if getattr(e, "modality", "") == "text"]
        if encoders is not None and not texts:
            raise ValueError(
                f"knowbert: the candidates index a text view; encoders: {list(encoders)}"
            )
        #: the text view the spans index
        self.text_view = texts[0] if texts else "text"
        dropout = cfg.transformer.attn_dropout
        self.kar = nn.ModuleDict(
            {str(i): KnowledgeAttention(width, cfg.entity_dim, cfg.kar_heads, dropout)
             for i in cfg.kar_after}
        )  # fmt: skip
        self.entities = EntityTable(cfg.entities, cfg.entity_dim)

    def data_needs(self) -> dict[str, Need]:
        c = self.cfg
        facts = {"field": c.candidates, "text_view": self.text_view,
                 "entities": c.entities.id_list(), "max_candidates": c.max_candidates}  # fmt: skip
        return {"candidates": Need("candidates", facts)}

    def candidates(
        self, tokens: dict[str, ModalityTokens], batch: Batch | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Spans [B,M,2] as positions of the joined tokens, candidate rows [B,M,C], priors."""
        t = next(iter(tokens.values())).mask
        B, device = t.shape[0], t.device
        if not self.cfg.knowledge or batch is None or "candidate_spans" not in batch:
            none = torch.full((B, 1, 1), -1, dtype=torch.long, device=device)
            return none.expand(B, 1, 2), none, torch.zeros(B, 1, 1, device=device)
        start = 0  # the text view's first position in the joined sequence
        for m, tok in tokens.items():
            if m == self.text_view:
                break
            start += tok.mask.shape[1]
        spans_BM2 = batch["candidate_spans"].to(device)
        spans_BM2 = torch.where(spans_BM2 >= 0, spans_BM2 + start, spans_BM2)
        return spans_BM2, batch["candidate_ids"].to(device), batch["candidate_priors"].to(device)

    def forward(
        self, tokens: dict[str, ModalityTokens], batch: Batch | None = None
    ) -> FusionOutput:
        x_BND, mask_BN, sizes = join_tokens(tokens)
        visible_BNN = self.visibility(tokens, batch)
        attn = mask_BN if visible_BNN is None else visible_BNN
        spans_BM2, cand_BMC, prior_BMC = self.candidates(tokens, batch)
        link: dict[int, torch.Tensor] = {}
        for i, block in enumerate(self.stack.blocks, 1):
            x_BND = block(x_BND, attn)
            if str(i) in self.kar:
                x_BND, link[i] = self.kar[str(i)](
                    x_BND, spans_BM2, cand_BMC, prior_BMC, self.entities.rows
                )
        x_BND = self.stack.norm(x_BND)
        out = split_joint(x_BND, tokens, sizes, self.cfg.modality_pooling, self.pooler)
        return KnowBertOutput(out.hidden, out.mask, out.pooled, link=link)


def _check(cfg: KnowBertFusion.Config) -> None:
    """One-line errors for KnowBERT's settings."""
    n = cfg.transformer.layers
    after = list(cfg.kar_after)
    if not after or sorted(set(after)) != after or not all(1 <= i <= n for i in after):
        raise ValueError(
            f"knowbert.kar_after must be increasing layers in 1..{n} (the layers a KAR "
            f"follows), got {after}"
        )
    if cfg.unimodal_layers:
        raise ValueError("knowbert: unimodal_layers are not supported (KAR reads one stack)")
    if cfg.entity_dim < 1 or cfg.kar_heads < 1 or cfg.entity_dim % cfg.kar_heads:
        raise ValueError(
            f"knowbert: entity_dim ({cfg.entity_dim}) must be a positive multiple of "
            f"kar_heads ({cfg.kar_heads})"
        )
    if cfg.max_candidates < 1:
        raise ValueError(f"knowbert.max_candidates must be >= 1, got {cfg.max_candidates}")


__all__ = ["KnowBertFusion", "KnowBertOutput"]
