"""ERNIE (THU) knowledge fusion (Zhang et al. 2019): N ordinary layers, then M knowledge layers.

The modalities are concatenated as in ``single_stream`` (text alone: ERNIE; text + regions:
a single-stream vision-language model with entities). The first ``transformer.layers``
blocks are the T-Encoder. Each of the ``knowledge_layers`` K-Encoder layers (ERNIE's
"aggregator") keeps two streams aligned position by position: token states w [B,N,D] and
entity states e [B,N,K], an entity living at the first token of its mention (``entity_ids``
from the text plug-in's ``spans``) or at a region (``region_entity_ids``), zeros elsewhere.
A layer attends over the tokens and, separately, over the entities of the sample, then fuses
at each position j

    h_j = GELU(W_t·w̃_j + W_e·ẽ_j + b)      (a token aligned to an entity)
    h_j = GELU(W_t·w̃_j + b)                (every other token)

and splits h back into new token and entity states, w_j = W'_t·h_j and e_j = W'_e·h_j, each
with the residual and LayerNorm of a BERT output sublayer, as ERNIE's code does (the paper
writes the split as σ(W h + b)). Entity states are kept only where an entity is.

Entity vectors come from :class:`~mmptm.encoders.entities.EntityTable` (TransE vectors of
``mmptm kg train-embeddings``, frozen by default as in ERNIE; published entity width 100).
The fusion declares the annotations it reads (``entity_views``: view → json field), and the
table's id list as their vocabulary, so a recipe names the embeddings once.
``knowledge: false`` keeps the same architecture and ignores every entity (all -1): the
"without the graph" baseline.

Legend: B batch, N tokens (all modalities), D width, K entity width, H fusion hidden width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from mmptm.batch import Batch
from mmptm.encoders.base import ModalityTokens, init_weights
from mmptm.encoders.entities import EntityTable, EntityTableConfig
from mmptm.fusion.base import Fusion, FusionOutput, join_tokens, split_joint
from mmptm.layers import Attention, TransformerBlock, TransformerConfig
from mmptm.layers.transformer import ACTIVATIONS
from mmptm.modalities.base import Need
from mmptm.registry import FUSIONS

#: per modality: the batch key (before the view prefix) of entity ids aligned to its tokens,
#: and the plug-in facts that make it, from a json field and an id list
ENTITY_INPUTS = {
    "text": "entity_ids",
    "regions": "region_entity_ids",
}


def entity_need(modality: str, field_name: str, id_list: str) -> dict:
    """The plug-in facts that give a view of ``modality`` its entity ids from ``field_name``."""
    if modality == "text":
        facts: dict = {"spans": {"entity": field_name}}
        if id_list:
            facts["span_vocabularies"] = {"entity": id_list}
        return facts
    if modality == "regions":
        facts = {"entities": field_name}
        if id_list:
            facts["entity_vocabulary"] = id_list
        return facts
    raise ValueError(f"entity ids align to {sorted(ENTITY_INPUTS)} views, not {modality!r}")


class KnowledgeLayer(nn.Module):
    """One K-Encoder layer: token and entity self-attention, fusion, split (module docstring)."""

    def __init__(
        self,
        width: int,
        entity_dim: int,
        entity_heads: int,
        cfg: TransformerConfig,
        entity_output: bool = True,
    ) -> None:
        super().__init__()
        eps = cfg.layer_norm_eps
        self.prenorm = cfg.prenorm
        self.attn = Attention(width, cfg.heads, cfg.attn_dropout)
        self.norm1 = nn.LayerNorm(width, eps=eps)
        self.entity_attn = Attention(entity_dim, entity_heads, cfg.attn_dropout)
        self.entity_norm1 = nn.LayerNorm(entity_dim, eps=eps)
        hidden = int(width * cfg.mlp_ratio)
        self.w_t = nn.Linear(width, hidden)  # W_t and the one bias b
        self.w_e = nn.Linear(entity_dim, hidden, bias=False)  # W_e
        self.act = ACTIVATIONS[cfg.activation]()
        self.out = nn.Linear(hidden, width)  # h → new token states
        self.norm2 = nn.LayerNorm(width, eps=eps)
        # The last layer's entity states would feed nothing: it has no entity output (pre-LN
        # still normalises the entities it fuses).
        self.entity_out = nn.Linear(hidden, entity_dim) if entity_output else None
        if entity_output or cfg.prenorm:
            self.entity_norm2 = nn.LayerNorm(entity_dim, eps=eps)
        self.drop = nn.Dropout(cfg.dropout)

    def fuse(self, w_BND: torch.Tensor, e_BNK: torch.Tensor, has_BN: torch.Tensor) -> torch.Tensor:
        """h [B,N,H]: GELU(W_t w + W_e e + b) where an entity is, GELU(W_t w + b) elsewhere."""
        x_BNH = self.w_t(w_BND)
        x_BNH = x_BNH + self.w_e(e_BNK) * has_BN.unsqueeze(-1).to(x_BNH.dtype)
        return self.act(x_BNH)

    def forward(
        self, w_BND: torch.Tensor, e_BNK: torch.Tensor, mask_BN: torch.Tensor, has_BN: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        N = has_BN.shape[1]
        # An entity sees the sample's entities; a position without one sees only itself (its
        # state is discarded), so no query row is empty.
        eye_NN = torch.eye(N, dtype=torch.bool, device=has_BN.device)
        visible_BNN = has_BN[:, None, :] | eye_NN
        d = self.drop
        if self.prenorm:
            w_BND = w_BND + d(self.attn(self.norm1(w_BND), mask_BK=mask_BN))
            e_BNK = e_BNK + d(self.entity_attn(self.entity_norm1(e_BNK), mask_BK=visible_BNN))
            h_BNH = self.fuse(self.norm2(w_BND), self.entity_norm2(e_BNK), has_BN)
            w_BND = w_BND + d(self.out(h_BNH))
            if self.entity_out is not None:
                e_BNK = e_BNK + d(self.entity_out(h_BNH))
        else:  # post-LN, as BERT and ERNIE
            w_BND = self.norm1(w_BND + d(self.attn(w_BND, mask_BK=mask_BN)))
            e_BNK = self.entity_norm1(e_BNK + d(self.entity_attn(e_BNK, mask_BK=visible_BNN)))
            h_BNH = self.fuse(w_BND, e_BNK, has_BN)
            w_BND = self.norm2(w_BND + d(self.out(h_BNH)))
            if self.entity_out is not None:
                e_BNK = self.entity_norm2(e_BNK + d(self.entity_out(h_BNH)))
        return w_BND, e_BNK * has_BN.unsqueeze(-1).to(e_BNK.dtype)


@FUSIONS.register("ernie")
class ErnieFusion(Fusion):
    """T-Encoder (``transformer.layers``) + K-Encoder (``knowledge_layers``) over all modalities."""

    @dataclass
    class Config:
        type: str = "ernie"
        #: the T-Encoder's shape (its ``layers``); heads, widths, dropout and norm layout are
        #: shared with the K-Encoder's token stream
        transformer: TransformerConfig = field(default_factory=TransformerConfig)
        #: K-Encoder layers (ERNIE base: 6 + 6)
        knowledge_layers: int = 2
        #: width of the entity stream (ERNIE: 100, TransE's) and its attention heads
        entity_dim: int = 100
        entity_heads: int = 4
        entities: EntityTableConfig = field(default_factory=EntityTableConfig)
        #: view (encoder name) → json field of its entity annotations: mentions for text
        #: (``[[start, end, id], ...]``), one id or null per region for regions
        entity_views: dict[str, str] = field(default_factory=lambda: {"text": "mentions"})
        #: false: ignore every entity (all -1) with the same architecture (the without-graph
        #: baseline); dEA then trains nothing
        knowledge: bool = True
        pooler: bool = True
        modality_pooling: str = "mean"

    def __init__(
        self,
        cfg: Config,
        *,
        width: int,
        encoders: nn.ModuleDict | None = None,
        **_: object,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        if cfg.knowledge_layers < 0:
            raise ValueError(f"ernie.knowledge_layers must be >= 0, got {cfg.knowledge_layers}")
        encoders = encoders if encoders is not None else {}
        #: view → (modality, batch key of its entity ids)
        self.entity_keys: dict[str, tuple[str, str]] = {}
        for view in cfg.entity_views:
            if view not in encoders:
                raise ValueError(
                    f"ernie.entity_views names {view!r}, which has no encoder ({sorted(encoders)})"
                )
            enc = encoders[view]
            if enc.modality not in ENTITY_INPUTS:
                raise ValueError(
                    f"ernie.entity_views: {view!r} is a {enc.modality!r} view; entity ids align "
                    f"to {sorted(ENTITY_INPUTS)} views"
                )
            self.entity_keys[view] = (enc.modality, enc.prefix + ENTITY_INPUTS[enc.modality])
        self.blocks = nn.ModuleList(
            TransformerBlock(width, cfg.transformer) for _ in range(cfg.transformer.layers)
        )
        self.knowledge = nn.ModuleList(
            KnowledgeLayer(
                width,
                cfg.entity_dim,
                cfg.entity_heads,
                cfg.transformer,
                entity_output=i < cfg.knowledge_layers - 1,
            )
            for i in range(cfg.knowledge_layers)
        )
        eps = cfg.transformer.layer_norm_eps
        closing = cfg.transformer.prenorm and (cfg.transformer.layers + cfg.knowledge_layers) > 0
        self.norm = nn.LayerNorm(width, eps=eps) if closing else nn.Identity()
        self.pooler = nn.Sequential(nn.Linear(width, width), nn.Tanh()) if cfg.pooler else None
        init_weights(self)
        # built after init_weights: the table keeps its loaded (or drawn) rows
        self.entities = EntityTable(cfg.entities, cfg.entity_dim)

    def data_needs(self) -> dict[str, Need]:
        ids = self.cfg.entities.id_list()
        return {
            view: Need(modality, entity_need(modality, self.cfg.entity_views[view], ids))
            for view, (modality, _) in self.entity_keys.items()
        }

    def entity_ids(self, tokens: dict[str, ModalityTokens], batch: Batch | None) -> torch.Tensor:
        """Entity rows aligned to the concatenated tokens [B,N] (-1: none)."""
        parts = []
        for m, t in tokens.items():
            B, N = t.mask.shape
            key = self.entity_keys.get(m, ("", ""))[1]
            if self.cfg.knowledge and batch is not None and key in batch:
                parts.append(batch[key].to(t.mask.device))
            else:
                parts.append(torch.full((B, N), -1, dtype=torch.long, device=t.mask.device))
        return torch.cat(parts, dim=1)

    def forward(
        self, tokens: dict[str, ModalityTokens], batch: Batch | None = None
    ) -> FusionOutput:
        x_BND, mask_BN, sizes = join_tokens(tokens)
        ids_BN = self.entity_ids(tokens, batch)
        has_BN = (ids_BN >= 0) & mask_BN
        for block in self.blocks:  # T-Encoder
            x_BND = block(x_BND, mask_BN)
        e_BNK = self.entities(ids_BN.masked_fill(~has_BN, -1)).to(x_BND.dtype)
        for layer in self.knowledge:  # K-Encoder
            x_BND, e_BNK = layer(x_BND, e_BNK, mask_BN, has_BN)
        x_BND = self.norm(x_BND)
        return split_joint(x_BND, tokens, sizes, self.cfg.modality_pooling, self.pooler)


__all__ = ["ENTITY_INPUTS", "ErnieFusion", "KnowledgeLayer", "entity_need"]
