"""``POST /api/describe``: a caption for an uploaded image, when the server has a run that
writes (the index's own, a CLIP with a caption decoder such as ``coca_tiny``, or
``mmptm serve --captioner RUN``).

The cost of a request is bounded: the upload is checked and shrunk as a search upload is
(size, pixels, the decoding threads), and decoding is fixed at :data:`DESCRIBE` (beam 3, at
most 32 pieces), under the server's model lock.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from mmptm.generate.decoding import DecodeConfig
from mmptm.generate.generator import Generator

if TYPE_CHECKING:
    from mmptm.search.index import SearchIndex

#: how the server decodes: every request costs at most this
DESCRIBE = DecodeConfig(beam=3, max_len=32)
#: the shard members an uploaded picture may be read as, in order
IMAGE_MEMBERS = ("jpg", "png", "jpeg", "webp")


class DescribeOut(BaseModel):
    #: the caption written for the upload
    text: str
    #: the language it is written in
    lang: str | None
    #: shrinking excluded: the model's time, measured by the server
    latency_ms: float


def describer_for(
    index: Any, captioner: str | None = None, device: str = "cpu"
) -> Generator | None:
    """The run that writes captions: ``captioner`` (a run directory or checkpoint) when
    given, else the index's own run if it can write and reads pictures; None otherwise."""
    if captioner:
        gen = Generator.load(captioner, device=device)
        if _member(gen) is None:
            raise ValueError(f"--captioner {captioner}: it reads {gen.members}, not pictures")
        return gen
    enc = getattr(index, "enc", None)
    if enc is None or getattr(enc, "tokenizer", None) is None:
        return None
    try:
        gen = Generator(enc.model, enc.tokenizer, enc.cfg, str(enc.device))
    except ValueError:  # the index's run has no objective that writes
        return None
    return gen if _member(gen) else None


def _member(gen: Generator) -> str | None:
    return next((m for m in IMAGE_MEMBERS if m in gen.members), None)


def add_describe_route(
    app: FastAPI,
    index: SearchIndex,
    describer: Generator | None,
    lock: threading.Lock,
    upload: Any,
) -> None:
    """``POST /api/describe``. ``upload(request)`` reads, checks and shrinks an upload as
    the image search does (its HTTP errors included) and returns (name, bytes)."""

    @app.post(
        "/api/describe",
        response_model=DescribeOut,
        responses={
            400: {"description": "an undecodable image, an unknown language"},
            404: {"description": "this server has no run that writes captions"},
            413: {"description": "over the upload limits"},
            415: {"description": "the upload is not an image"},
            503: {"description": "the image decoders are busy: try again after Retry-After"},
        },
    )
    async def describe(
        request: Request,
        lang: str | None = Query(None, description="language to write (default: the run's)"),
    ) -> DescribeOut:
        """An uploaded image (multipart field ``file``) → a caption."""
        if describer is None:
            raise HTTPException(
                404, "this server's run does not write captions (mmptm serve --captioner RUN)"
            )
        name, data = await upload(request)
        return await run_in_threadpool(_describe, describer, lock, name, data, lang or None)


def _describe(
    gen: Generator, lock: threading.Lock, name: str, data: bytes, lang: str | None
) -> DescribeOut:
    sample = {"__key__": "upload", _member(gen): data}
    with lock:
        t0 = time.perf_counter()
        try:
            out = gen.generate([sample], DESCRIBE, lang=lang)[0]
        except ValueError as e:
            raise HTTPException(400, f"{name!r}: {e}") from None
        ms = 1000 * (time.perf_counter() - t0)
    written = lang or gen.default_language
    return DescribeOut(text=out.text, lang=written, latency_ms=round(ms, 3))
