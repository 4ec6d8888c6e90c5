"""AdamW with decoupled weight-decay groups, and the warmup + decay schedule."""

from __future__ import annotations

import fnmatch
import math

import torch
from torch import nn

from mmptm.recipe import TrainConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: biases, norm weights and scalars/vectors (type embeddings,
    logit scale) are not decayed."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def freeze(model: nn.Module, patterns: list[str]) -> list[str]:
    """Stop training the parameters whose names match any glob pattern; returns their names.

    A pattern that matches nothing is an error (a typo would otherwise train everything).
    """
    params = dict(model.named_parameters())
    frozen: list[str] = []
    for pattern in patterns:
        matched = [n for n in params if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            sample = ", ".join(sorted({n.rsplit(".", 2)[0] + ".*" for n in params})[:12])
            raise ValueError(
                f"train.freeze: {pattern!r} matches no parameter; names look like {sample}, ..."
            )
        frozen += [n for n in matched if n not in frozen]
    for name in frozen:
        params[name].requires_grad_(False)
    return frozen


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of ``cfg.lr`` at ``step``: linear warmup, then the configured decay."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    span = max(cfg.max_steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    if cfg.schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_optimizer(
    model: nn.Module, cfg: TrainConfig, fused: bool = False
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    opt = torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.betas[0], cfg.betas[1]),
        eps=cfg.eps,
        fused=fused or None,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    return opt, sched
