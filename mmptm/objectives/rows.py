"""What the data sides that give a sample several rows share (NLVR2's two images, VCR's four
choices): each per-sample value of a batch repeated, row by row."""

from __future__ import annotations

from typing import Any

import torch


def repeat_rows(value: Any, B: int, k: int) -> Any:
    """A per-sample value (a tensor or list with ``B`` rows), each row ``k`` times in a row
    (rows 0, 0, ..., 1, 1, ...); anything else (a batch-level value) unchanged."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == B:
        return value.repeat_interleave(k, dim=0)
    if isinstance(value, list) and len(value) == B:
        return [v for v in value for _ in range(k)]
    return value


__all__ = ["repeat_rows"]
