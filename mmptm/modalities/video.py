"""Video: encoding clips to bytes with PyAV (FFmpeg inside the ``av`` wheel).

The video plug-in (decoding ``mp4``/``webm``/``mkv`` members in loader workers) lands here
too; :func:`encode_video` is what toyworld, the converters and the tests write clips with.
Encoded bytes embed the library version (``av`` is pinned): compare decoded frames, never
encoded bytes.
Legend: T frames, H×W pixels.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

#: container → (codec, pixel format) written by :func:`encode_video`
CODECS: dict[str, tuple[str, str]] = {
    "mp4": ("libx264", "yuv420p"),
    "webm": ("libvpx-vp9", "yuv420p"),
    "mkv": ("libx264", "yuv420p"),
}


def encode_video(
    frames_THWC: np.ndarray,
    fps: float = 8.0,
    container: str = "mp4",
    *,
    quality: int = 18,
    options: dict[str, str] | None = None,
) -> bytes:
    """Encode uint8 RGB frames ``[T,H,W,3]`` as a video file in memory.

    ``quality`` is the constant rate factor (lower = better; 18 is visually lossless for
    x264). H and W must be even (4:2:0 chroma). ``options`` go to the codec as they are
    (e.g. ``{"g": "4"}``: a key frame every 4 frames).
    """
    if container not in CODECS:
        raise ValueError(f"container must be one of {sorted(CODECS)}, got {container!r}")
    frames = np.asarray(frames_THWC)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [T,H,W,3], got {frames.dtype} {frames.shape}")
    T, H, W, _ = frames.shape
    if T < 1 or H % 2 or W % 2:
        raise ValueError(f"need >= 1 frame of even height and width, got {frames.shape}")
    import av  # imported here: reading shards without video must not need it

    codec, pix_fmt = CODECS[container]
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska" if container == "mkv" else container) as out:
        stream = out.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = W, H, pix_fmt
        stream.options = {"crf": str(quality), **(options or {})}
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


__all__ = ["CODECS", "encode_video"]
