"""KEPLER's knowledge-embedding objective (Wang et al. 2021): entities are their descriptions.

A triple batch (``mmptm.converters.triples``, a source with ``pairs: stack``) holds the
head descriptions in text rows 0..B-1 and the tail descriptions in rows B..2B-1, each
encoded alone, and ``relation_ids [B]`` (the relation plug-in, which this objective
declares with its relation vocabulary). An entity's embedding is the final state of its
description's first token ([CLS], KEPLER's <s>); relations are a learned table of the
model's width. TransE scores them (KEPLER's choice), d(h, t) = ‖h + r − t‖_p, and the loss is

    −log σ(γ − d(h, t)) − (1/N) Σ_i log σ(d(h'_i, t'_i) − γ),      γ = 4,

``mmptm.layers.kge.nssa_loss`` at α = 0 (the loss of ``mmptm kg train-embeddings``).
``model: rotate`` scores with RotatE instead, d(h, t) = ‖h ∘ e^{iθ} − t‖ (the width's halves
are the real and imaginary parts, a relation is D/2 phases): TransE can give a symmetric
relation (WordNet's *derivationally related form*, *similar to*) nothing but r ≈ 0, which
ranks the head itself first; a rotation by π is symmetric without that collapse. Any model of
``mmptm.layers.kge.MODELS`` works; the link-prediction evaluation scores with the same one.
Negatives (data side, seeded): N per triple, each replacing the head (probability ½) or
the tail by the head or tail of another triple of the batch (in-batch negative sampling,
so no extra description is encoded). Jointly with MLM on a text source: ``model.routes``
sends the triple source to this objective and the text source to MLM.

Legend: B triples, N negatives, D width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from mmptm.batch import PAIRS, Batch
from mmptm.encoders.base import VocabInfo
from mmptm.fusion.base import FusionOutput
from mmptm.layers.kge import COMPLEX_MODELS, MODELS, Scorer, nssa_loss, relation_width
from mmptm.modalities.base import Need, read_id_list
from mmptm.objectives.base import Objective
from mmptm.registry import OBJECTIVES


@dataclass
class SampleCorruptions:
    """For each of B stacked triples, N corruptions: another triple's row whose head
    (``ke_corrupt_head``) or tail replaces this one's (``ke_negatives [B,N]``)."""

    data_priority: ClassVar[int] = 20  # after the pairs are stacked (15)

    negatives: int

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch:
        rel = batch.get("relation_ids")
        if rel is None or batch.get(PAIRS) != "stacked" or len(rel) < 2:
            return batch
        B, N = len(rel), self.negatives
        shift_BN = torch.randint(1, B, (B, N), generator=g)  # never 0: not the triple itself
        batch["ke_negatives"] = (torch.arange(B)[:, None] + shift_BN) % B
        batch["ke_corrupt_head"] = torch.rand(B, N, generator=g) < 0.5
        return batch


#: RotatE's relation table holds θ·ρ/π (ρ this, init uniform in (−ρ, ρ): θ uniform in (−π, π)), as
#: RotatE's own code scales its phases: AdamW moves an entry about lr a step, so a phase moves
#: π/ρ ≈ 31 times as far (0.03 rad at lr 1e-3; unscaled, 1 200 steps left every relation near
#: its random start)
PHASE_RANGE = 0.1


@OBJECTIVES.register("knowledge_embedding")
class KnowledgeEmbedding(Objective):
    """TransE over description encodings with KEPLER's loss (module docstring)."""

    @dataclass
    class Config:
        type: str = "knowledge_embedding"
        weight: float = 1.0
        #: the relation vocabulary (``relations.txt`` beside the triple shards)
        relations: str = ""
        #: relations when there is no vocabulary (integer relation ids)
        num_relations: int = 0
        #: the score: transe (KEPLER's), rotate, distmult or complex (``mmptm.layers.kge``)
        model: str = "transe"
        #: γ
        margin: float = 4.0
        #: corruptions per triple, drawn from the batch
        negatives: int = 8
        #: the norm of d (1: TransE's L1 / RotatE's sum of moduli, as ``mmptm kg
        #: train-embeddings``)
        p_norm: int = 1
        #: the text view whose stacked rows are the descriptions
        modality: str = "text"

    @classmethod
    def data_transform(cls, cfg: Config, vocab: VocabInfo) -> SampleCorruptions:
        if cfg.negatives < 1:
            raise ValueError(f"knowledge_embedding.negatives must be >= 1, got {cfg.negatives}")
        return SampleCorruptions(cfg.negatives)

    def __init__(self, cfg: Config, *, width: int, **_: object) -> None:
        super().__init__()
        self.cfg = cfg
        n = len(read_id_list(cfg.relations)) if cfg.relations else cfg.num_relations
        if n < 1:
            raise ValueError(
                "knowledge_embedding needs relations (an id list, e.g. the relations.txt "
                "`mmptm data triples` writes) or num_relations >= 1"
            )
        if cfg.model not in MODELS:
            raise ValueError(
                f"knowledge_embedding.model: unknown {cfg.model!r}; choices: {', '.join(MODELS)}"
            )
        if cfg.model in COMPLEX_MODELS and width % 2:
            raise ValueError(
                f"knowledge_embedding.model={cfg.model} needs an even width, got {width}"
            )
        self.score = Scorer(cfg.model, cfg.p_norm)
        self.relations = nn.Embedding(n, relation_width(cfg.model, width))
        if cfg.model == "rotate":  # phases, scaled (PHASE_RANGE)
            nn.init.uniform_(self.relations.weight, -PHASE_RANGE, PHASE_RANGE)
        else:
            nn.init.normal_(self.relations.weight, std=0.02)

    def relation_table(self) -> torch.Tensor:
        """The relation rows the score reads ``[R,D]``; RotatE's phases ``[R,D/2]``."""
        w = self.relations.weight
        return w * (math.pi / PHASE_RANGE) if self.cfg.model == "rotate" else w

    def data_needs(self) -> dict[str, Need]:
        facts = {"vocabulary": self.cfg.relations} if self.cfg.relations else {}
        return {"relation": Need("relation", facts)}

    def entity_vectors(self, out: FusionOutput) -> torch.Tensor:
        """One vector per text row: the final state of its first token [rows,D]."""
        return out.hidden[self.cfg.modality][:, 0]

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        if "ke_negatives" not in batch:  # not a triple batch
            return {}
        rel_B = batch["relation_ids"]
        neg_BN, head_BN = batch["ke_negatives"], batch["ke_corrupt_head"]
        e_2BD = self.entity_vectors(out).float()
        B = len(rel_B)
        h_BD, t_BD = e_2BD[:B], e_2BD[B:]
        r_BD = self.relation_table()[rel_B].float()  # [B,D/2] phases for rotate
        pos_B = self.score(h_BD, r_BD, t_BD)  # −d(h, t)
        corrupt_BN1 = head_BN.unsqueeze(-1)
        h_BND = torch.where(corrupt_BN1, h_BD[neg_BN], h_BD[:, None])
        t_BND = torch.where(corrupt_BN1, t_BD[:, None], t_BD[neg_BN])
        neg_BN_scores = self.score(h_BND, r_BD[:, None], t_BND)
        loss = nssa_loss(pos_B, neg_BN_scores, self.cfg.margin, temperature=0.0)
        # the share of negatives the true triple outscores (a training link-prediction signal)
        acc = (pos_B[:, None] > neg_BN_scores).float().mean()
        return {"loss": loss, "acc": acc.detach(), "distance": -pos_B.mean().detach()}
