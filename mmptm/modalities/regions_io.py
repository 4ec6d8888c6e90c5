"""The ``regions.npz`` member: detector regions of an image, written and read as bytes.

It holds ``features`` float32 [R,F], ``boxes`` float32 [R,4] (x1, y1, x2, y2 normalised to
[0, 1]), ``image_size`` int32 [2] (w, h), and optionally ``probs`` float32 [R,C] (the
detector's class distribution) and ``labels`` int64 [R]. :func:`regions_npz_bytes` writes it
(converters, toyworld), :func:`load_regions` reads it (the regions plug-in; the text plug-in's
object tags).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

MEMBER = "regions.npz"
REGION_ARRAYS = ("features", "boxes", "image_size", "probs", "labels")  # npz member order
# Any fixed date >= 1980 works; numpy's own savez stamps the current time
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def regions_npz_bytes(record: Mapping[str, Any]) -> bytes:
    """The ``regions.npz`` member of a sample: deterministic bytes that ``np.load`` reads.

    ``record`` holds ``features`` [R,F], ``boxes`` [R,4] (normalised), ``image_size`` (w, h)
    and optionally ``probs`` [R,C] and ``labels`` [R]; None or missing optional arrays are
    left out. Arrays are cast to the contract's dtypes and shapes are checked.
    """
    features = np.asarray(record["features"], dtype=np.float32)
    if features.ndim != 2 or len(features) == 0:
        raise ValueError(f"region features must be [R,F] with R >= 1, got {features.shape}")
    r = len(features)
    arrays: dict[str, np.ndarray] = {
        "features": features,
        "boxes": np.asarray(record["boxes"], dtype=np.float32),
        "image_size": np.asarray(record["image_size"], dtype=np.int32),
    }
    if record.get("probs") is not None:
        arrays["probs"] = np.asarray(record["probs"], dtype=np.float32)
    if record.get("labels") is not None:
        arrays["labels"] = np.asarray(record["labels"], dtype=np.int64)
    expected = {"boxes": (r, 4), "image_size": (2,), "labels": (r,)}
    for name, array in arrays.items():
        shape = expected.get(name)
        if name == "probs":
            shape = (r, array.shape[-1]) if array.ndim == 2 else None
        if shape is not None and array.shape != shape:
            raise ValueError(f"regions: {name} has shape {array.shape}, expected {shape}")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in REGION_ARRAYS:
            if name in arrays:
                info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
                info.create_system = 3  # the default depends on the OS writing the file
                info.external_attr = 0o644 << 16
                zf.writestr(info, _npy_bytes(arrays[name]))
    return buf.getvalue()


def load_regions(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of a ``regions.npz`` member."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}
