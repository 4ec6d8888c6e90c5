"""Model FLOPs of a training step and model FLOPs utilisation (MFU).

FLOPs are counted, not estimated: ``torch.utils.flop_counter.FlopCounterMode`` records the
matrix products and attention of the first step's forward and backward passes as they run,
so every modality, the attention over each sequence length, frozen towers (no weight
gradients) and heads computed at masked positions only are counted as they are. (6·N·tokens
holds for a text decoder; for a model with several encoders, unequal token counts per
modality and masked-position heads it can be far off.) Attention's backward counts its
scores again (5 products, torch's convention: fused kernels recompute them). A block that
activation checkpointing recomputes in backward runs its forward twice; the second one is
not counted: MFU counts the model's FLOPs, not the hardware's.

The count is per step on this rank; batches padded to their longest sample vary, so it is
the first step's, not an average.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Collection, Iterator

import torch
from torch.utils.checkpoint import set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten

#: dense bf16 peak FLOP/s of known accelerators, by a part of ``torch.cuda.get_device_name``;
#: the first match counts, so longer names come before the names they contain
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H800", 989e12),
    ("H20", 148e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("MI325X", 1307e12),
    ("MI300X", 1307e12),
    ("MI250X", 383e12),
)


def known_peak(device_name: str) -> float | None:
    """The bf16 dense peak FLOP/s of an accelerator named ``device_name``, if known."""
    for part, flops in PEAK_BF16_FLOPS:
        if part in device_name:
            return flops
    return None


def peak_flops(device: torch.device, configured: float = 0.0) -> float | None:
    """Peak FLOP/s of one device: ``configured`` if set, else the table's for a known GPU,
    else None (no MFU)."""
    if configured > 0:
        return configured
    if device.type != "cuda":
        return None
    return known_peak(torch.cuda.get_device_name(device))


def _cpu_attention(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_attention_backward(grad_shape, query_shape, key_shape, value_shape, *args, **kwargs):
    return sdpa_backward_flop_count(grad_shape, query_shape, key_shape, value_shape)


#: FlopCounterMode knows the CUDA kernels of scaled_dot_product_attention but not the CPU one
CPU_ATTENTION = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward,
}


class FlopCount:
    """Adds up the FLOPs of forward and backward passes run inside :meth:`forward` and
    :meth:`backward`. ``recomputed``: names of the modules that activation checkpointing
    recomputes (relative to the model; their forward FLOPs are taken off once, since the
    backward count holds them again)."""

    def __init__(self, recomputed: Collection[str] = ()) -> None:
        self.flops = 0
        self._suffixes = tuple(f".{name}" for name in recomputed)

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        # whole blocks are recomputed (not up to their last saved tensor), so that what
        # backward recomputes is what is taken off here
        with (
            FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as mode,
            set_checkpoint_early_stop(False),
            warnings.catch_warnings(),
        ):
            # its module hooks fire twice for a compiled model, which changes no count
            warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)`")
            yield
        # FlopCounterMode names modules "<root class>.<path>": the path is a suffix
        again = sum(
            sum(ops.values())
            for name, ops in mode.get_flop_counts().items()
            if name.endswith(self._suffixes)
        )
        self.flops += mode.get_total_flops() - again

    @contextlib.contextmanager
    def backward(self) -> Iterator[None]:
        with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as mode:
            yield
        self.flops += mode.get_total_flops()


def mfu(flops_per_step: float, steps_per_s: float, peak: float, devices: int) -> float:
    """The share of ``devices`` × ``peak`` FLOP/s that the model's FLOPs use."""
    return flops_per_step * steps_per_s / (peak * devices)
