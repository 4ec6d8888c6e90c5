"""Image queries at the size the model needs: header checks and reduced decoding.

An uploaded photo may hold 50 times the pixels a query encoder looks at (a 6000×6000 PNG
for a 224-pixel input). :func:`shrink` decodes it at a reduced scale where the format
allows (JPEG's DCT scaling, ``draft``), otherwise decodes it and reduces it by an integer
factor (``Image.reduce``, a box filter), and keeps at least :data:`MARGIN` times the model's
input on each side, so that the image plug-in's own resize (``fit``) then gives what it
would give from the full image. What needs no reduction is returned as it came, undecoded.

``mmptm serve`` runs :func:`shrink` in its decoding threads, ``SearchIndex.search_image``
on file bytes itself; a large decode gives its memory back to the system when it is done
(:func:`release_memory`), so that the server's resident size does not keep its peak.
"""

from __future__ import annotations

import ctypes
import functools
import io
import warnings
from collections.abc import Callable

from PIL import Image, UnidentifiedImageError

#: the default limit on an image query's decoded size: a small PNG can inflate to gigabytes
MAX_IMAGE_PIXELS = 40_000_000
#: a reduced image keeps at least this many times the model's input on each side (Pillow's
#: ``reducing_gap``: from 3 on, indistinguishable from resampling the full image)
MARGIN = 3
#: modes a PNG stores as they are; others are converted to RGB(A) before saving
PNG_MODES = frozenset({"1", "L", "LA", "P", "RGB", "RGBA", "I;16"})
#: images decoded at more pixels than this hand their memory back to the system afterwards
TRIM_PIXELS = 4_000_000


class TooLarge(ValueError):
    """An image over the pixel limit (the server answers 413)."""


class NotAnImage(ValueError):
    """Bytes that are not an image PIL reads (the server answers 415)."""


def image_size(
    data: bytes, max_pixels: int = MAX_IMAGE_PIXELS, name: str = "image"
) -> tuple[int, int]:
    """(width, height) from the header only; ``NotAnImage`` or ``TooLarge`` otherwise."""
    try:
        with warnings.catch_warnings():  # PIL warns past 89 Mpixels; the check below decides
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                w, h = im.size
    except Image.DecompressionBombError:  # past 179 Mpixels PIL refuses to open it at all
        raise TooLarge(f"{name!r} is too many pixels to decode") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise NotAnImage(f"{name!r} is not an image PIL can read (JPEG, PNG, ...)") from None
    if w * h > max_pixels:
        raise TooLarge(f"{name!r} is {w}×{h} pixels: the limit is {max_pixels} pixels")
    return w, h


def shrink(data: bytes, size: int, max_pixels: int = MAX_IMAGE_PIXELS) -> bytes:
    """``data`` (an image file) reduced for a model whose input is ``size`` pixels square:
    a PNG at least ``MARGIN × size`` on its shorter side, or ``data`` itself when it is no
    more than twice that (or ``size`` is 0). ``ValueError`` for what cannot be decoded."""
    try:
        w, h = image_size(data, max_pixels)
    except NotAnImage:
        raise ValueError("not a decodable image: no image format PIL reads") from None
    target = MARGIN * size
    if not size or min(w, h) < 2 * target:
        return data
    try:
        small = _decode_reduced(data, target)
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"not a decodable image: {e}") from None
    finally:  # the full-size pixels are freed by now
        if w * h > TRIM_PIXELS:
            release_memory()
    buf = io.BytesIO()
    small.save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def _decode_reduced(data: bytes, target: int) -> Image.Image:
    """The image decoded (JPEG: at a reduced scale) and reduced by an integer factor to no
    less than ``target`` pixels on its shorter side, in a mode PNG stores."""
    with Image.open(io.BytesIO(data)) as img:
        img.draft(None, (target, target))  # JPEG: decode at 1/2, 1/4 or 1/8 scale
        img.load()  # a GIF: its first frame
        small = _reduce(img, min(img.size) // target)
    if small.mode not in PNG_MODES:
        small = small.convert("RGBA" if "A" in small.mode else "RGB")
    return small


def _reduce(img: Image.Image, factor: int) -> Image.Image:
    """``img`` made ``factor`` times smaller: a box filter (alpha premultiplied, as the
    plug-in resizes; 16-bit grey at 32 bits), or nearest neighbour for palette and bilevel
    images (as the plug-in resizes them)."""
    if factor < 2:
        return img.copy()
    if img.mode in ("1", "P"):
        size = (-(-img.width // factor), -(-img.height // factor))
        return img.resize(size, Image.NEAREST)
    if img.mode == "I;16":
        return img.convert("I").reduce(factor).convert("I;16")
    return img.reduce(factor)


def release_memory() -> None:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``): the buffers
    of one large decode would otherwise stay in the process's resident memory."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:  # the symbols the process has loaded: libc's among them
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to give back this way
        return None
