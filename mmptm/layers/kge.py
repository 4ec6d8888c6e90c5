"""Knowledge-graph embedding scores and losses, shared by `kg train-embeddings` and objectives.

A score is "higher = more plausible": TransE's is the negative distance −‖h + r − t‖_p
(Bordes et al. 2013), DistMult's the trilinear product Σ h·r·t (Yang et al. 2015), RotatE's
the negative distance −‖h ∘ e^{iθ} − t‖ of a rotation in the complex plane (Sun et al. 2019),
ComplEx's Re Σ h·r·t̄ (Trouillon et al. 2016). Every function works on the last dimension and
broadcasts over the others, so one call scores ``[B,D]`` positives, ``[B,N,D]`` negatives, or
``[B,1,D]`` queries against ``[1,E,D]`` entities.

Complex vectors (RotatE's and ComplEx's entities, ComplEx's relations) are real rows of even
width D = 2K, the real parts then the imaginary parts (``[re | im]``), so every entity table
stays a real ``[E,D]`` array; RotatE's relations are K phases θ (|e^{iθ}| = 1, the modulus is
fixed by construction). TransE cannot give a symmetric relation anything but r ≈ 0 (h + r = t
and t + r = h), which then ranks h itself first for (h, r, ?); a rotation by π and a real
ComplEx relation are symmetric without that collapse.

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


def _complex(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(real, imaginary) halves of ``[re | im]`` rows."""
    if x.shape[-1] % 2:
        raise ValueError(f"complex rows need an even width, got {x.shape[-1]}")
    re, im = x.chunk(2, dim=-1)
    return re, im


def complex_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise product of ``[re | im]`` rows."""
    a_re, a_im = _complex(a)
    b_re, b_im = _complex(b)
    return torch.cat([a_re * b_re - a_im * b_im, a_re * b_im + a_im * b_re], dim=-1)


def rotation(phase: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """``[re | im]`` of e^{iθ} (e^{−iθ} with ``inverse``) for phases θ ``[...,K]``."""
    sin = torch.sin(phase)
    return torch.cat([torch.cos(phase), -sin if inverse else sin], dim=-1)


class _ModulusSum(torch.autograd.Function):
    """Σ_k |a_k − b_k| of ``[re | im]`` rows, broadcasting. Why not ``vector_norm`` over an
    unflattened (2, K) axis: on CPU that strided reduction made RotatE's training step ~10×
    and its ranking ~50× slower than TransE's; ``hypot``'s backward is NaN at 0, this one 0."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        re, im = _complex(a - b)
        moduli = torch.sqrt(re * re + im * im)
        ctx.save_for_backward(re, im, moduli)
        ctx.shapes = (a.shape, b.shape)
        return moduli.sum(-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        re, im, moduli = ctx.saved_tensors
        scale = grad.unsqueeze(-1) / moduli.masked_fill(moduli == 0, float("inf"))
        g = torch.cat([re * scale, im * scale], dim=-1)
        shape_a, shape_b = ctx.shapes
        grad_a = g.sum_to_size(shape_a) if ctx.needs_input_grad[0] else None
        grad_b = (-g).sum_to_size(shape_b) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


def complex_distance(a: torch.Tensor, b: torch.Tensor, p: int = 1) -> torch.Tensor:
    """‖a − b‖ of ``[re | im]`` rows: p = 1, the sum of the moduli |a_k − b_k| (RotatE's
    paper); p = 2, √Σ|a_k − b_k|² (PyKEEN's RotatE default; the real L2 of the rows)."""
    if p == 2:
        return torch.linalg.vector_norm(a - b, dim=-1)
    return _ModulusSum.apply(a, b)


def rotate_score(h: torch.Tensor, phase: torch.Tensor, t: torch.Tensor, p: int = 1) -> torch.Tensor:
    """−‖h ∘ e^{iθ} − t‖ (see :func:`complex_distance` for p)."""
    return -complex_distance(complex_mul(h, rotation(phase)), t, p)


def complex_score(h: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Re Σ_k h_k r_k conj(t_k): Re(z · conj(w)) is the real dot product of the rows."""
    return (complex_mul(h, r) * t).sum(-1)


def conj(x: torch.Tensor) -> torch.Tensor:
    """Complex conjugate of ``[re | im]`` rows."""
    re, im = _complex(x)
    return torch.cat([re, -im], dim=-1)


MODELS = ("transe", "distmult", "rotate", "complex")
COMPLEX_MODELS = ("rotate", "complex")  # entity rows are [re | im]: an even width


def relation_width(model: str, dim: int) -> int:
    """Width of a relation row: RotatE's K = D/2 phases, else D."""
    return dim // 2 if model == "rotate" else dim


@dataclass(frozen=True)
class Scorer:
    """A model's score in query form: s(h, r, t) = match(tail_query(h, r), t)
    = match(head_query(r, t), h).

    TransE: queries h + r and t − r, match −‖q − e‖_p; DistMult: queries h∘r and r∘t, match
    ⟨q, e⟩; RotatE: queries h∘e^{iθ} and t∘e^{−iθ} (|h∘e^{iθ} − t| = |h − t∘e^{−iθ}|, the
    rotation keeps moduli), match −‖q − e‖ (complex); ComplEx: queries h∘r and r̄∘t
    (Re h r t̄ = Re h · conj(r t̄)), match ⟨q, e⟩ of the real rows. A negative that replaces one
    side then costs one match against the other side's query, and ranking all entities is one
    ``match_all`` (``cdist`` or a matrix product).
    """

    model: str = "transe"
    p: int = 1

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(
                f"unknown knowledge-graph model {self.model!r}; choices: {', '.join(MODELS)}"
            )

    def __call__(self, h: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.model == "transe":
            return transe_score(h, r, t, self.p)
        if self.model == "rotate":
            return rotate_score(h, r, t, self.p)
        return complex_score(h, r, t) if self.model == "complex" else distmult_score(h, r, t)

    def tail_query(self, h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        if self.model == "transe":
            return h + r
        if self.model == "rotate":
            return complex_mul(h, rotation(r))
        return complex_mul(h, r) if self.model == "complex" else h * r

    def head_query(self, r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.model == "transe":
            return t - r
        if self.model == "rotate":
            return complex_mul(t, rotation(r, inverse=True))
        return complex_mul(conj(r), t) if self.model == "complex" else r * t

    def match(self, q: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """Scores of queries against entities, elementwise over broadcast leading dims."""
        if self.model == "transe":
            return -distance(q, e, self.p)
        if self.model == "rotate":
            return -complex_distance(q, e, self.p)
        return (q * e).sum(-1)

    def match_all(self, q_BD: torch.Tensor, e_CD: torch.Tensor) -> torch.Tensor:
        """Scores [B,C] of every query against every entity."""
        # not the ‖q‖² + ‖e‖² − 2q·e shortcut: its rounding would break exact ties
        mode = "donot_use_mm_for_euclid_dist"
        if self.model == "transe" or (self.model == "rotate" and self.p == 2):
            # RotatE's L2 over complex numbers is the real L2 of the [re | im] rows
            return -torch.cdist(q_BD, e_CD, p=self.p, compute_mode=mode)
        if self.model == "rotate":
            # a sum of moduli has no cdist: broadcast, a few queries at a time ([b,C,D] ≤ 2²²),
            # in place and without the autograd Function (ranking needs no gradient)
            step = max(1, (1 << 22) // max(1, e_CD.numel()))
            out = []
            for i in range(0, len(q_BD), step):
                re, im = _complex(q_BD[i : i + step, None] - e_CD[None])
                out.append(-re.square_().add_(im.square_()).sqrt_().sum(-1))
            return torch.cat(out)
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
