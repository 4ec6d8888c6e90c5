"""Word–region alignment (UNITER's WRA): optimal transport between a pair's words and regions.

The transport cost of word i to region j is ``1 - cos(h_i, v_j)`` between the fused hidden
states of the text tokens and of the regions (every real token, [CLS] and [SEP] included, as
UNITER); both sides carry uniform mass over their real tokens. The transport plan ``T`` comes
from IPOT (Xie et al., 2018: an inexact proximal point method, ``beta`` the step of its KL
proximal term, ``iterations`` outer steps of ``inner`` Sinkhorn updates each), solved batched
without gradient; the distance ``<C, T>`` then carries the gradient through the cost alone,
as UNITER does. For ``beta`` small enough and enough iterations the plan is the exact optimal
one (tests/objectives/test_wra.py checks it against POT's network simplex).

Loss (UNITER's): the OT distance of matched pairs minus that of mismatched ones, summed and
averaged over the pairs, ``(Σ d_pos - Σ d_neg) / (n_pos + n_neg)``. Which pairs are mismatched
is ITM's data side's ``itm_labels`` (1 = matched): WRA trains on the batches ITM's negatives
are drawn in. With ``model.task_mix`` that is the ITM task, so UNITER's full objective set
groups the two, ``task_mix: {itm+wra: 2, ...}`` (UNITER computes its OT loss on ITM's
batches, weighted ``itm_ot_lambda = 0.1``); a batch without ``itm_labels`` gets no loss.

Legend: B batch, L text tokens, R regions, D width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from mmptm.batch import Batch
from mmptm.fusion.base import FusionOutput
from mmptm.objectives.base import Objective
from mmptm.registry import OBJECTIVES


def cosine_cost(x_BLD: torch.Tensor, y_BRD: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Transport cost [B,L,R]: one minus the cosine similarity of every pair of tokens."""
    x_BLD = F.normalize(x_BLD, dim=-1, eps=eps)
    y_BRD = F.normalize(y_BRD, dim=-1, eps=eps)
    return 1.0 - x_BLD @ y_BRD.transpose(1, 2)


@torch.no_grad()
def ipot(
    cost_BLR: torch.Tensor,
    x_real_BL: torch.Tensor,
    y_real_BR: torch.Tensor,
    beta: float = 0.5,
    iterations: int = 50,
    inner: int = 1,
) -> torch.Tensor:
    """The IPOT transport plan [B,L,R] between uniform masses on each row's real x and y
    tokens, zero at padding (each real row sums to 1/n_x, each real column to 1/n_y once
    converged). A row with no real token on a side gets a zero plan.

    UNITER's update order: the x scaling persists across the outer iterations, y's is
    recomputed from it, then x's from y's."""
    has_B = x_real_BL.any(1) & y_real_BR.any(1)
    # a side with no real token would divide by zero: solve such rows over all positions,
    # then drop their plan
    x_real_BL = x_real_BL | ~has_B[:, None]
    y_real_BR = y_real_BR | ~has_B[:, None]
    real_BLR = x_real_BL[:, :, None] & y_real_BR[:, None, :]
    n_x_B11 = x_real_BL.sum(1).float()[:, None, None]
    n_y_B11 = y_real_BR.sum(1).float()[:, None, None]
    # the proximal kernel exp(-C / beta), zero at padding so that padding gets no mass
    kernel_BLR = torch.exp(-cost_BLR.float() / beta) * real_BLR
    plan_BLR = real_BLR.float()
    a_BL1 = x_real_BL.float()[:, :, None] / n_x_B11
    # padded entries of a scaling: 1 / (0 + 1e4) rather than 1 / 0 (UNITER's device)
    x_pad_BL1 = (~x_real_BL).float()[:, :, None] * 1e4
    y_pad_B1R = (~y_real_BR).float()[:, None, :] * 1e4
    for _ in range(iterations):
        q_BLR = kernel_BLR * plan_BLR
        for _ in range(inner):
            b_B1R = 1.0 / (n_y_B11 * (a_BL1.transpose(1, 2) @ q_BLR) + y_pad_B1R)
            a_BL1 = 1.0 / (n_x_B11 * (q_BLR @ b_B1R.transpose(1, 2)) + x_pad_BL1)
        plan_BLR = a_BL1 * q_BLR * b_B1R
    return plan_BLR * real_BLR * has_B[:, None, None]


def ot_distance(
    x_BLD: torch.Tensor,
    y_BRD: torch.Tensor,
    x_real_BL: torch.Tensor,
    y_real_BR: torch.Tensor,
    beta: float = 0.5,
    iterations: int = 50,
    inner: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(OT distance [B] = <C, T>, differentiable through the cost; the plan T [B,L,R]),
    computed in fp32 under autocast too (UNITER: "run in fp32 for stability"; IPOT's scalings
    are reciprocals of sums that bf16 would round)."""
    with torch.autocast(x_BLD.device.type, enabled=False):
        cost_BLR = cosine_cost(x_BLD.float(), y_BRD.float())
        real_BLR = x_real_BL[:, :, None] & y_real_BR[:, None, :]
        cost_BLR = cost_BLR.masked_fill(~real_BLR, 0.0)
        plan_BLR = ipot(cost_BLR.detach(), x_real_BL, y_real_BR, beta, iterations, inner)
        return (cost_BLR * plan_BLR).sum((1, 2)), plan_BLR


@OBJECTIVES.register("wra")
class WordRegionAlignment(Objective):
    """UNITER's WRA: OT distance of matched pairs down, of ITM's mismatched pairs up."""

    @dataclass
    class Config:
        type: str = "wra"
        #: UNITER's ``itm_ot_lambda``
        weight: float = 0.1
        #: the text view and the visual view (regions, or image patches) it aligns
        modalities: list[str] = field(default_factory=lambda: ["text", "regions"])
        #: IPOT: the proximal step, outer iterations and Sinkhorn updates per iteration
        #: (UNITER's 0.5, 50, 1)
        beta: float = 0.5
        iterations: int = 50
        inner: int = 1

        def __post_init__(self) -> None:
            if len(self.modalities) != 2:
                raise ValueError(f"wra.modalities must name two views, got {self.modalities}")
            if not self.beta > 0:
                raise ValueError(f"wra.beta must be > 0, got {self.beta}")
            if self.iterations < 1 or self.inner < 1:
                raise ValueError(
                    f"wra.iterations and wra.inner must be >= 1, got {self.iterations}, "
                    f"{self.inner}"
                )

    def __init__(self, cfg: Config, **_: object) -> None:
        super().__init__()
        self.cfg = cfg

    def bind(self, objectives: nn.ModuleDict) -> None:
        """WRA's negatives are ITM's: the model needs an ``itm`` objective that draws them on
        the data side (``negatives: random`` or ``overlap``)."""
        for objective in objectives.values():
            c = getattr(objective, "cfg", None)
            if getattr(c, "type", "") == "itm" and getattr(c, "negatives", "") != "hard":
                return
        raise ValueError(
            "wra contrasts ITM's matched and mismatched pairs: add an itm objective with "
            f"negatives: random or overlap (objectives: {list(objectives)})"
        )

    def forward(self, out: FusionOutput, batch: Batch) -> dict[str, torch.Tensor]:
        text, visual = self.cfg.modalities
        if "itm_labels" not in batch or text not in out.hidden or visual not in out.hidden:
            return {}  # a batch ITM drew no negatives in, or of another source: inactive
        dist_B, _ = ot_distance(
            out.hidden[text], out.hidden[visual], out.mask[text].bool(),
            out.mask[visual].bool(), self.cfg.beta, self.cfg.iterations, self.cfg.inner,
        )  # fmt: skip
        matched_B = batch["itm_labels"].to(dist_B.device) != 0
        # a pair with no real token on a side has no plan: left out of the mean
        has_B = out.mask[text].any(1) & out.mask[visual].any(1)
        n = int(has_B.sum())
        signed_B = torch.where(matched_B, dist_B, -dist_B) * has_B
        loss = signed_B.sum() / max(n, 1)
        pos = (dist_B * (matched_B & has_B)).sum() / (matched_B & has_B).sum().clamp_min(1)
        neg = (dist_B * (~matched_B & has_B)).sum() / (~matched_B & has_B).sum().clamp_min(1)
        return {"loss": loss, "pos": pos.detach(), "neg": neg.detach()}
