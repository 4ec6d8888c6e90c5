"""KnowBERT's knowledge attention and recontextualisation (KAR; Peters et al., 2019).

Inserted between two Transformer layers: the word states are projected to the entity width
(H_proj = H W1 + b1), each candidate mention span is pooled by self-attention over its pieces
and the mentions attend to each other (one Transformer block); the entity linker scores each
candidate from its dot product with the mention and its prior p(e | alias) (a two-layer MLP,
KnowBERT's), and the mention becomes s = LayerNorm(m + Σ softmax(scores) e). The words then
attend to the mentions (word-to-entity-span attention; a learned null key keeps rows without
mentions defined), an MLP follows, and H' = H + (…) W2 + b2 with W2 started at the
pseudo-inverse of W1. ``linking_loss`` is the linker's cross entropy against gold entities.
Legend: B batch, L tokens, D width, E entity width, M mention spans, C candidates per span.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.layers.attention import Attention
from mmptm.layers.transformer import TransformerBlock, TransformerConfig


class KAROutput(NamedTuple):
    """The recontextualised word states and the linker's scores (-inf where no candidate)."""

    h_BLD: torch.Tensor
    link_BMC: torch.Tensor


class KnowledgeAttention(nn.Module):
    """KAR: link candidate mentions to entity vectors and fold them back into the words."""

    def __init__(self, width: int, entity_dim: int, heads: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        E = entity_dim
        self.proj = nn.Linear(width, E)
        self.span_score = nn.Linear(E, 1)
        block = TransformerConfig(layers=1, heads=heads, dropout=dropout, attn_dropout=dropout)
        self.mentions = TransformerBlock(E, block)
        self.linker = nn.Sequential(nn.Linear(2, 100), nn.ReLU(), nn.Linear(100, 1))
        self.norm = nn.LayerNorm(E)
        self.null_E = nn.Parameter(torch.zeros(E))
        self.attend = Attention(E, heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(E, 4 * E), nn.GELU(), nn.Linear(4 * E, E))
        self.back = nn.Linear(E, width)
        with torch.no_grad():  # KnowBERT starts W2 at W1's pseudo-inverse
            self.back.weight.copy_(torch.linalg.pinv(self.proj.weight))  # [D,E]
            self.back.bias.zero_()

    def forward(
        self,
        h_BLD: torch.Tensor,
        spans_BM2: torch.Tensor,
        cand_BMC: torch.Tensor,
        prior_BMC: torch.Tensor,
        entities: Callable[[torch.Tensor], torch.Tensor],
    ) -> KAROutput:
        """``spans_BM2``: [first, last] piece of each candidate span (-1: no span);
        ``cand_BMC``: entity rows (-1: none) that ``entities`` (an ``nn.Embedding``, an entity
        table's ``rows``) turns into vectors [B,M,C,E]; ``prior_BMC``: p(e | alias)."""
        p_BLE = self.proj(h_BLD)
        has_BM = spans_BM2[..., 0] >= 0
        pos_L = torch.arange(h_BLD.shape[1], device=h_BLD.device)
        inside_BML = (
            (pos_L >= spans_BM2[..., :1]) & (pos_L <= spans_BM2[..., 1:]) & has_BM[..., None]
        )
        a_BML = self.span_score(p_BLE).squeeze(-1)[:, None, :].expand_as(inside_BML)
        w_BML = torch.softmax(a_BML.masked_fill(~inside_BML, float("-inf")), -1).nan_to_num(0.0)
        m_BME = w_BML @ p_BLE  # self-attentive span pooling
        # mentions attend to each other; a row without any sees its padding (outputs unused)
        see_BM = has_BM | ~has_BM.any(1, keepdim=True)
        m_BME = self.mentions(m_BME, see_BM)
        valid_BMC = (cand_BMC >= 0) & has_BM[..., None]
        e_BMCE = entities(cand_BMC.clamp(min=0))
        dot_BMC = (m_BME[:, :, None, :] * e_BMCE).sum(-1)
        link_BMC = self.linker(torch.stack([dot_BMC, prior_BMC.to(dot_BMC.dtype)], -1))
        link_BMC = link_BMC.squeeze(-1).masked_fill(~valid_BMC, float("-inf"))
        alpha_BMC = torch.softmax(link_BMC, -1).nan_to_num(0.0)
        s_BME = self.norm(m_BME + (alpha_BMC[..., None] * e_BMCE).sum(2))
        B, E = s_BME.shape[0], s_BME.shape[-1]
        keys_BKE = torch.cat([self.null_E.expand(B, 1, E), s_BME], 1)  # K = 1 + M
        linked_BM = valid_BMC.any(-1)
        keep_BK = torch.cat([linked_BM.new_ones(B, 1), linked_BM], 1)
        r_BLE = self.mlp(self.attend(p_BLE, keys_BKE, keep_BK))
        return KAROutput(h_BLD + self.back(r_BLE), link_BMC)


def linking_loss(
    link_BMC: torch.Tensor, gold_BM: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Cross entropy of the linker against the gold candidate, accuracy) over the spans
    whose gold entity is among their candidates (``gold_BM``: its index, -1: none)."""
    on_BM = (gold_BM >= 0) & torch.isfinite(link_BMC).any(-1)
    n = int(on_BM.sum())
    if n == 0:
        zero = link_BMC.new_zeros(()) + 0.0 * link_BMC.nan_to_num(0.0, 0.0, 0.0).sum()
        return zero, zero.detach()
    logits_NC, gold_N = link_BMC[on_BM], gold_BM[on_BM]
    loss = F.cross_entropy(logits_NC.float(), gold_N)
    acc = (logits_NC.argmax(-1) == gold_N).float().mean()
    return loss, acc.detach()
