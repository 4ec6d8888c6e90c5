"""Knowledge-graph embedding scores and losses, shared by `kg train-embeddings` and objectives.

A score is "higher = more plausible": TransE's is the negative distance −‖h + r − t‖_p
(Bordes et al. 2013), DistMult's the trilinear product Σ h·r·t (Yang et al. 2015). Every
function works on the last dimension and broadcasts over the others, so one call scores
``[B,D]`` positives, ``[B,N,D]`` negatives, or ``[B,1,D]`` queries against ``[1,E,D]`` entities.

Losses take positive scores ``pos_B`` and negative scores ``neg_BN`` (N negatives per positive):

- ``nssa``: the negative-sampling loss with self-adversarial weights of RotatE (Sun et al. 2019),
  −log σ(γ + s⁺) − Σ_i p_i log σ(−s⁻_i − γ), p = softmax(α·s⁻) held constant (no gradient).
  With α = 0 the weights are uniform and it is KEPLER's knowledge-embedding loss.
- ``margin``: TransE's margin ranking loss, mean over pairs of max(0, γ − s⁺ + s⁻).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


class _L1Distance(torch.autograd.Function):
    """‖a − b‖₁ over the last dimension, broadcasting. Why not ``vector_norm(ord=1)``: on CPU
    its forward and its backward (through ``sgn``, which also serves complex numbers) are each
    about 10× slower than ``abs`` and ``sign``; this is the training step's largest cost."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        diff = a - b
        ctx.save_for_backward(diff)
        ctx.shapes = (a.shape, b.shape)
        return diff.abs().sum(-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        (diff,) = ctx.saved_tensors
        g = diff.sign() * grad.unsqueeze(-1)
        shape_a, shape_b = ctx.shapes
        grad_a = g.sum_to_size(shape_a) if ctx.needs_input_grad[0] else None
        grad_b = (-g).sum_to_size(shape_b) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


def distance(a: torch.Tensor, b: torch.Tensor, p: int = 1) -> torch.Tensor:
    """‖a − b‖_p over the last dimension (broadcast over the others)."""
    if p == 1:
        return _L1Distance.apply(a, b)
    return torch.linalg.vector_norm(a - b, ord=p, dim=-1)


def transe_score(h: torch.Tensor, r: torch.Tensor, t: torch.Tensor, p: int = 1) -> torch.Tensor:
    """−‖h + r − t‖_p over the last dimension (broadcast over the others)."""
    return -distance(h + r, t, p)


def distmult_score(h: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Σ_d h_d r_d t_d over the last dimension (a symmetric relation model)."""
    return (h * r * t).sum(-1)


MODELS = ("transe", "distmult")


@dataclass(frozen=True)
class Scorer:
    """A model's score in query form: s(h, r, t) = match(tail_query(h, r), t)
    = match(head_query(r, t), h).

    TransE: queries h + r and t − r, match −‖q − e‖_p; DistMult: queries h∘r and r∘t, match
    ⟨q, e⟩. A negative that replaces one side then costs one match against the other side's
    query, and ranking all entities is one ``match_all`` (``cdist`` or a matrix product).
    """

    model: str = "transe"
    p: int = 1

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(
                f"unknown knowledge-graph model {self.model!r}; choices: {', '.join(MODELS)}"
            )

    def __call__(self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return transe_score(h, r, t, self.p) if self.model == "transe" else distmult_score(h, r, t)

    def tail_query(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return h + r if self.model == "transe" else h * r

    def head_query(self, r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return t - r if self.model == "transe" else r * t

    def match(self, q: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """Scores of queries against entities, elementwise over broadcast leading dims."""
        if self.model == "transe":
            return -distance(q, e, self.p)
        return (q * e).sum(-1)

    def match_all(self, q_BD: torch.Tensor, e_CD: torch.Tensor) -> torch.Tensor:
        """Scores [B,C] of every query against every entity."""
        if self.model == "transe":
            # not the ‖q‖² + ‖e‖² − 2q·e shortcut: its rounding would break exact ties
            mode = "donot_use_mm_for_euclid_dist"
            return -torch.cdist(q_BD, e_CD, p=self.p, compute_mode=mode)
        return q_BD @ e_CD.T


def nssa_loss(
    pos_B: torch.Tensor, neg_BN: torch.Tensor, margin: float, temperature: float
) -> torch.Tensor:
    """Self-adversarial negative-sampling loss (α = ``temperature``; 0: uniform, as KEPLER)."""
    weights_BN = torch.softmax(temperature * neg_BN.detach(), dim=-1)
    pos_loss = -F.logsigmoid(margin + pos_B).mean()
    neg_loss = -(weights_BN * F.logsigmoid(-neg_BN - margin)).sum(-1).mean()
    return pos_loss + neg_loss


def margin_ranking_loss(pos_B: torch.Tensor, neg_BN: torch.Tensor, margin: float) -> torch.Tensor:
    """Mean over (positive, negative) pairs of max(0, γ − s⁺ + s⁻)."""
    return F.relu(margin - pos_B.unsqueeze(-1) + neg_BN).mean()


LOSSES = ("nssa", "margin")


def kge_loss(
    name: str, pos_B: torch.Tensor, neg_BN: torch.Tensor, margin: float, temperature: float = 1.0
) -> torch.Tensor:
    """``nssa`` or ``margin`` (see the module docstring)."""
    if name == "nssa":
        return nssa_loss(pos_B, neg_BN, margin, temperature)
    if name == "margin":
        return margin_ranking_loss(pos_B, neg_BN, margin)
    raise ValueError(f"unknown knowledge-graph loss {name!r}; choices: {', '.join(LOSSES)}")
