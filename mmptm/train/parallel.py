"""Fully sharded data parallel (FSDP2) and activation checkpointing of a model's blocks.

``shard`` applies ``torch.distributed.fsdp.fully_shard`` to every block (a module whose class
name is in ``train.block_modules``: mmptm's ``TransformerBlock``, timm's ViT ``Block``) and
then to the root, so each block's parameters are gathered only while it runs. Scalar
parameters (a contrastive objective's ``logit_scale``) cannot be sharded: they stay whole on
every rank and ``average_gradients`` all-reduces their gradients as DDP would.

``checkpoint_blocks`` makes each block recompute its forward in the backward pass (non-
reentrant ``torch.utils.checkpoint``), trading compute for activation memory under DDP, FSDP
or one process alike. The block's ``forward`` is replaced on the instance, so parameter names
and checkpoints do not change.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint


def find_blocks(model: nn.Module, names: list[str]) -> list[nn.Module]:
    """The modules whose class name is in ``names``, children before their parents."""
    found = [m for m in model.modules() if type(m).__name__ in names]
    inner = {id(c) for m in found for c in m.modules() if c is not m}
    return [m for m in found if id(m) in inner] + [m for m in found if id(m) not in inner]


def outermost(blocks: list[nn.Module]) -> list[nn.Module]:
    """The blocks not inside another of ``blocks``."""
    inner = {id(c) for m in blocks for c in m.modules() if c is not m}
    return [m for m in blocks if id(m) not in inner]


def shard(model: nn.Module, block_names: list[str], bf16: bool) -> list[nn.Parameter]:
    """Shard ``model`` in place over the default process group, each block one unit.

    Returns the parameters left whole on every rank (scalars), whose gradients the caller
    averages with :func:`average_gradients`. ``bf16``: compute in bf16, with the parameters
    gathered in bf16 and the gradients reduced in fp32.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if bf16:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    whole = [p for p in model.parameters() if p.ndim == 0]
    blocks = find_blocks(model, block_names)
    for block in blocks:
        if any(p.ndim == 0 for p in block.parameters()):
            raise ValueError(
                f"train.block_modules: {type(block).__name__} has a scalar parameter, which "
                "FSDP cannot shard; leave that class out"
            )
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp, ignored_params=set(whole) or None)
    return whole


def average_gradients(params: list[nn.Parameter]) -> None:
    """All-reduce (mean) the gradients of parameters every rank holds whole, in one call; a
    rank without a gradient for one contributes zeros (as DDP does for unused parameters)."""
    params = [p for p in params if p.requires_grad]
    if not params or not dist.is_initialized():
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads]).float()
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    start = 0
    for p, g in zip(params, grads):
        p.grad = flat[start : start + g.numel()].view_as(g).to(g.dtype)
        start += g.numel()


def checkpoint_blocks(model: nn.Module, block_names: list[str]) -> list[nn.Module]:
    """Recompute each outermost block's forward in backward; returns those blocks."""
    blocks = outermost(find_blocks(model, block_names))
    for block in blocks:
        # the bound forward of the class, so that FSDP's hooks (run by __call__) stay outside
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return blocks
