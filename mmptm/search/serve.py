"""``mmptm serve``: a search index over HTTP (FastAPI) and the search page that uses it.

:func:`create_app` wraps a :class:`~mmptm.search.index.SearchIndex` (or anything with its
methods) in a FastAPI app: a JSON API under ``/api`` (schema at ``/openapi.json``) and the page
at ``/`` (``static/``: one HTML, one script, one style sheet; no CDN, no web font, so it works
offline). :func:`serve` binds a socket and runs uvicorn; :func:`running` does the same in a
background thread, for tests, benchmarks and notebooks.

Bad input is the client's fault and says so: ``{"detail": "..."}`` with 400 (empty or too long
query, bad ``k``, unknown language or side), 404 (unknown key), 413 (upload too large, in bytes
or pixels), 415 (not an image); 422 only where FastAPI's own type validation answers (``k=abc``).
The index raises ValueError / KeyError for what it refuses; they become 400 / 404 here.

An uploaded image is decoded apart from the searches, by a thread at a lower CPU priority
(:class:`DecodePool`), at the size the model needs (``images.shrink``); when it and its
short queue are busy, an upload gets 503 with ``Retry-After``, and text searches keep their
pace. A request whose ``Host`` is not this server's (DNS rebinding: a
page elsewhere whose name now points here) gets 400; no answer names a path on the server.
HEAD is answered wherever GET is. With a run that writes, ``POST /api/describe`` captions
an uploaded image (:mod:`mmptm.search.describe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

from mmptm.generate.generator import Generator
from mmptm.search.describe import add_describe_route, describer_for
from mmptm.search.images import MAX_IMAGE_PIXELS, NotAnImage, TooLarge, image_size, shrink

if TYPE_CHECKING:
    from mmptm.search.index import Hit, SearchIndex

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")
#: the most results one request may ask for (and the most ITM re-ranking candidates)
MAX_K = 100
#: uploads larger than this are refused with 413 while they are read, never held whole
MAX_UPLOAD_MB = 20
#: threads decoding uploaded images, and uploads that may wait for one (then 503)
DECODE_WORKERS = 1
DECODE_QUEUE = 4
#: the Host headers answered by default: this machine's loopback names
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
#: bind addresses that listen on every interface: then any IP address is a valid Host
WILDCARDS = frozenset({"0.0.0.0", "::"})
#: the page: only this origin's scripts, styles, images and API (blob: for the upload preview)
CSP = (
    "default-src 'self'; img-src 'self' blob: data:; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
T = TypeVar("T")


class HitOut(BaseModel):
    key: str
    score: float
    rank: int
    side: str
    caption: str
    language: str | None
    has_thumbnail: bool
    #: the ITM score when the hit was re-ranked (rerank_k); re-ranked hits come first
    itm: float | None = None
    #: URL of the item's JPEG thumbnail (relative to the app), None without one
    thumbnail: str | None


class SearchOut(BaseModel):
    #: what was searched: "text", "image" or "key"
    query: str
    #: the text query, the uploaded file's name, or the key
    value: str
    k: int
    lang: str | None
    side: str | None
    hits: list[HitOut]
    #: encoding the query and searching the index, measured by the server
    latency_ms: float


class HealthOut(BaseModel):
    status: str
    #: index.json and what the index derived from it (run, sides, counts, languages, ...)
    index: dict[str, Any]
    max_k: int
    max_upload_mb: int
    max_image_pixels: int
    #: ``POST /api/describe`` writes captions (the server has a run that writes)
    can_describe: bool = False


ERRORS = {
    400: {"description": "bad query, k, language or side; an undecodable image"},
    404: {"description": "unknown key"},
}
BUSY = {503: {"description": "the image decoders are busy: try again after Retry-After"}}
UPLOAD_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {"file": {"type": "string", "format": "binary"}},
                }
            }
        },
    }
}


def _hit(hit: Hit) -> HitOut:
    thumb = f"api/thumb/{quote(hit.key, safe='')}" if hit.has_thumbnail else None
    return HitOut(**asdict(hit), thumbnail=thumb)


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise HTTPException(400, f"{name} must be between {low} and {high}, got {value}")


def create_app(
    index: SearchIndex,
    *,
    max_k: int = MAX_K,
    max_upload_mb: int = MAX_UPLOAD_MB,
    max_image_pixels: int = MAX_IMAGE_PIXELS,
    decode_workers: int = DECODE_WORKERS,
    decode_queue: int = DECODE_QUEUE,
    allowed_hosts: Collection[str] = LOCAL_HOSTS,
    describer: Generator | None = None,
) -> FastAPI:
    """The API and page over ``index``. Searches run in the thread pool (the event loop stays
    free for other requests) one at a time: the lock keeps the model's forward passes from
    competing for the same cores. Thumbnails and items do not wait for it: SearchIndex reads
    them from memory and with ``pread``, which threads may share. Uploaded images are
    decoded first by ``decode_workers`` threads, with ``decode_queue`` more waiting.
    ``allowed_hosts``: the names and addresses a request's Host may give (``*``: any; a
    wildcard address such as 0.0.0.0: any IP address). ``describer``: the run that answers
    ``POST /api/describe`` (:mod:`mmptm.search.describe`), or None."""
    if max_image_pixels < 1 or decode_workers < 1 or decode_queue < 0:
        raise ValueError("need max_image_pixels >= 1, decode_workers >= 1, decode_queue >= 0")
    pool = DecodePool(decode_workers, decode_queue)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        pool.close()

    app = FastAPI(
        title="mmptm search",
        summary="Text, image and more-like-this search over an `mmptm index` directory.",
        # Swagger UI and ReDoc load their scripts from a CDN; the schema stays at /openapi.json
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.decode_pool = pool
    lock = threading.Lock()
    _add_search_routes(app, index, lock, pool, max_k, max_upload_mb, max_image_pixels)
    _add_item_routes(app, index, max_k, max_upload_mb, max_image_pixels, describer is not None)

    async def upload(request: Request) -> tuple[str, bytes]:
        name, data = await _read_upload(request, max_upload_mb * 1024 * 1024, max_upload_mb)
        _check_image(name, data, max_image_pixels)
        size = getattr(index, "image_size", None) or 0
        return name, await pool.run(name, shrink, data, size, max_image_pixels)

    add_describe_route(app, index, describer, lock, upload)

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(
            STATIC / "index.html",
            headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
        )

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(HeadAsGet)
    app.add_middleware(HostCheck, allowed=allowed_hosts)  # the last added runs first
    return app


def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, with the index's refusals as HTTP errors."""
    try:
        return fn(*args, **kwargs)
    except KeyError as e:  # the index's message names the key
        raise HTTPException(404, str(e.args[0]) if e.args else "unknown key") from None
    except ValueError as e:
        from mmptm.search.store import DamagedIndex  # loaded with the index already

        # a file of the index that does not read back is the server's fault, not the client's
        status = 500 if isinstance(e, DamagedIndex) else 400
        raise HTTPException(status, str(e) or "bad request") from None


def _search(
    lock: threading.Lock, fn: Callable[..., list[Hit]], *args: Any, **kwargs: Any
) -> tuple[list, float]:
    """The hits of one search, under the lock, and its time in ms."""
    with lock:
        t0 = time.perf_counter()
        hits = _call(fn, *args, **kwargs)
        return hits, 1000 * (time.perf_counter() - t0)


def _results(
    kind: str, value: str, k: int, lang: str | None, side: str | None, found: tuple
) -> SearchOut:
    """The answer to one search; its ``side`` is that of the hits (the one asked, if none)."""
    hits, ms = found
    return SearchOut(
        query=kind, value=value, k=k, lang=lang, side=hits[0].side if hits else side,
        hits=[_hit(h) for h in hits], latency_ms=round(ms, 3),
    )  # fmt: skip


def _add_search_routes(
    app: FastAPI,
    index: SearchIndex,
    lock: threading.Lock,
    pool: DecodePool,
    max_k: int,
    max_upload_mb: int,
    max_image_pixels: int,
) -> None:
    """The three searches: by text, by an uploaded image, by an item's key."""
    max_bytes = max_upload_mb * 1024 * 1024
    k_query = Query(10, description=f"number of results, 1..{max_k}")
    lang_query = Query(None, description="caption language shown (on a text side: searched)")
    side_query = Query(None, description="side of the index to search (default: the other one)")

    @app.get("/api/search", response_model=SearchOut, responses=ERRORS)
    def search_text(
        q: str = Query(..., description="the text query"),
        k: int = k_query,
        lang: str | None = lang_query,
        side: str | None = side_query,
        rerank_k: int = Query(0, description=f"re-rank this many with ITM, 0..{max_k}"),
        query_lang: str | None = Query(None, description="the query's language (default: lang)"),
    ) -> SearchOut:
        """Text → items (by default the index's non-text side, e.g. images)."""
        _check_range("k", k, 1, max_k)
        _check_range("rerank_k", rerank_k, 0, max_k)
        found = _search(lock, index.search_text, q, k, lang=lang or None, side=side or None,
                        rerank_k=rerank_k, query_lang=query_lang or None)  # fmt: skip
        return _results("text", q, k, lang, side, found)

    @app.post(
        "/api/search/image",
        response_model=SearchOut,
        openapi_extra=UPLOAD_SCHEMA,
        responses={
            **ERRORS,
            413: {"description": f"over {max_upload_mb} MB or {max_image_pixels} pixels"},
            415: {"description": "the upload is not an image"},
            **BUSY,
        },
    )
    async def search_image(
        request: Request,
        k: int = k_query,
        lang: str | None = lang_query,
        side: str | None = side_query,
    ) -> SearchOut:
        """An uploaded image (multipart field ``file``) → items (by default captions)."""
        _check_range("k", k, 1, max_k)
        name, data = await _read_upload(request, max_bytes, max_upload_mb)
        _check_image(name, data, max_image_pixels)
        size = getattr(index, "image_size", None)  # None: no side reads images
        if size:
            data = await pool.run(name, shrink, data, size, max_image_pixels)
        found = await run_in_threadpool(
            _search, lock, index.search_image, data, k, lang=lang or None, side=side or None
        )
        return _results("image", name, k, lang, side, found)

    @app.get("/api/similar/{key}", response_model=SearchOut, responses=ERRORS)
    def similar(
        key: str, k: int = k_query, lang: str | None = lang_query, side: str | None = side_query
    ) -> SearchOut:
        """More like this: the stored vector of item ``key`` → the nearest other items."""
        _check_range("k", k, 1, max_k)
        found = _search(lock, index.search_key, key, k, lang=lang or None, side=side or None)
        return _results("key", key, k, lang, side, found)


def _add_item_routes(
    app: FastAPI,
    index: SearchIndex,
    max_k: int,
    max_upload_mb: int,
    max_image_pixels: int,
    can_describe: bool,
) -> None:
    """What the page shows beside the hits: thumbnails, an item's record, the health."""

    @app.get(
        "/api/thumb/{key}",
        response_class=Response,
        responses={200: {"content": {"image/jpeg": {}}}, 304: {}, 404: ERRORS[404]},
    )
    def thumbnail(key: str, request: Request) -> Response:
        """The item's JPEG thumbnail; cacheable (ETag, a day's max-age)."""
        data = _call(index.thumbnail, key)
        etag = f'"{hashlib.blake2b(data, digest_size=12).hexdigest()}"'
        headers = {"ETag": etag, "Cache-Control": "public, max-age=86400"}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(data, media_type="image/jpeg", headers=headers)

    @app.get("/api/item/{key}", responses={404: ERRORS[404]})
    def item(key: str) -> dict[str, Any]:
        """Everything the index stores about one item (captions per language, json fields)."""
        item = jsonable_encoder(_call(index.item, key))
        if "shard" in item:
            item["shard"] = hide_paths(item["shard"])
        return item

    @app.get("/api/health", response_model=HealthOut)
    def health() -> HealthOut:
        """The index served: its run, sides, item counts, languages; the request limits."""
        return HealthOut(
            status="ok", index=public_info(jsonable_encoder(index.info)), max_k=max_k,
            max_upload_mb=max_upload_mb, max_image_pixels=max_image_pixels,
            can_describe=can_describe,
        )  # fmt: skip


async def _read_upload(request: Request, max_bytes: int, max_mb: int) -> tuple[str, bytes]:
    """(file name, bytes) of the multipart field ``file``, refusing more than ``max_bytes``
    of request body with 413 as soon as the declared length or the bytes read pass it."""
    too_large = HTTPException(413, f"upload too large: the limit is {max_mb} MB")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    seen = 0

    async def receive() -> dict:  # counts the body as the multipart parser pulls it
        nonlocal seen
        message = await request.receive()
        seen += len(message.get("body", b""))
        if seen > max_bytes:
            raise too_large
        return message

    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise HTTPException(400, "send the image as multipart/form-data, field 'file'")
    # The parser spools file parts to disk past 1 MB, so memory stays bounded.
    form = await Request(request.scope, receive).form(max_files=1, max_fields=4)
    try:
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise HTTPException(400, "no file in the upload: send it as the form field 'file'")
        return upload.filename or "upload", await upload.read()
    finally:
        await form.close()


def _check_image(name: str, data: bytes, max_pixels: int) -> None:
    """415 unless ``data`` starts like an image PIL reads; 413 if it would decode to more
    than ``max_pixels`` (only the header is read)."""
    try:
        image_size(data, max_pixels, name)
    except TooLarge as e:
        raise HTTPException(413, str(e)) from None
    except NotAnImage as e:
        raise HTTPException(415, str(e)) from None


# --------------------------------------------------------------------------------------------
# decoding uploads apart from searching


class DecodePool:
    """Threads that decode uploaded images, apart from the searches: ``workers`` of them,
    at a lower CPU priority than the server's other threads (on Linux, where each thread has
    its own), with at most ``queue`` uploads waiting. Past that an upload gets 503 with
    ``Retry-After`` before it costs anything. PIL lets go of the GIL while it decodes and
    resizes, so a search runs meanwhile; a large decode hands its memory back to the
    system when it is done (``images.shrink``)."""

    def __init__(self, workers: int, queue: int) -> None:
        self.workers = workers
        self.capacity = workers + queue
        self.slots = threading.BoundedSemaphore(self.capacity)
        #: a running mean of one decode's seconds, for Retry-After
        self.seconds = 1.0
        self.executor = ThreadPoolExecutor(
            workers, thread_name_prefix="decode", initializer=_lower_priority
        )

    async def run(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a decoding thread; 503 when every thread and queue place is
        taken, 400 for the ValueError it raises."""
        if not self.slots.acquire(blocking=False):
            wait = math.ceil(self.seconds * self.capacity / self.workers)
            raise HTTPException(
                503, f"busy decoding {self.capacity} other images: try again in {wait} s",
                headers={"Retry-After": str(wait)},
            )  # fmt: skip
        try:
            future = self.executor.submit(_timed, fn, *args)
        except BaseException:
            self.slots.release()
            raise
        # the place is free when the decode is done, even if the client has gone meanwhile
        future.add_done_callback(lambda _: self.slots.release())
        try:
            result, seconds = await asyncio.wrap_future(future)
        except ValueError as e:
            raise HTTPException(400, f"{name!r}: {e}") from None
        self.seconds += 0.2 * (seconds - self.seconds)
        return result

    def close(self) -> None:
        """Let the threads end once the decodes under way are done."""
        self.executor.shutdown(wait=False, cancel_futures=True)


def _lower_priority() -> None:
    """A decoding thread's nice value 10 (Linux: per thread; elsewhere it would be the
    whole server's, so it is left alone)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


def _timed(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    t0 = time.perf_counter()
    return fn(*args), time.perf_counter() - t0


# --------------------------------------------------------------------------------------------
# what the server tells: its Host, HEAD, no paths


class HostCheck:
    """ASGI middleware: 400 for a request whose ``Host`` header is not in ``allowed``.

    A page on another site cannot read this API, unless its own name is made to resolve to
    this machine (DNS rebinding): its requests then carry that name as their Host. An IP
    address as the Host is the server's own origin, so a wildcard bind accepts any."""

    def __init__(self, app: Callable, allowed: Collection[str]) -> None:
        self.app = app
        self.allowed = frozenset(_host_name(h) for h in allowed)
        self.any_address = bool(self.allowed & WILDCARDS)

    def allows(self, host: str) -> bool:
        name = _host_name(host)
        if "*" in self.allowed or name in self.allowed:
            return True
        try:
            return self.any_address and bool(ipaddress.ip_address(name))
        except ValueError:
            return False

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
            if not self.allows(host):
                known = ", ".join(sorted(self.allowed))
                detail = (f"this server does not answer to Host {host!r} (it answers to "
                          f"{known}); its operator may add it with --allow-host")  # fmt: skip
                return await JSONResponse({"detail": detail}, 400)(scope, receive, send)
        await self.app(scope, receive, send)


def _host_name(host: str) -> str:
    """The name or address of a Host header (or an allow-list entry): no port, brackets
    or final dot; lower case."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8000
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:  # name:port (an IPv6 address has several colons)
        host = host.split(":")[0]
    return host.rstrip(".")


class HeadAsGet:
    """ASGI middleware: HEAD answered as GET would be, headers only (FastAPI's routes answer
    HEAD with 405)."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def headers_only(message: dict) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


def public_info(info: dict[str, Any]) -> dict[str, Any]:
    """``SearchIndex.info`` as the API shows it: the run by its name, the checkpoint from
    the run's folder on, any other absolute path cut to its file name."""
    out = hide_paths(info)
    run, ckpt = info.get("run"), info.get("checkpoint")
    if isinstance(run, str) and isinstance(ckpt, str):
        with contextlib.suppress(ValueError):  # not inside the run: its name (as hidden)
            out["checkpoint"] = str(Path(out["run"]) / Path(ckpt).relative_to(run))
    return out


def hide_paths(value: Any) -> Any:
    """``value`` (JSON) with each absolute path in its strings cut to the file's name:
    ``/data/x/train-*.tar`` → ``train-*.tar``, also in comma lists and ``key=/a/b``."""
    if isinstance(value, dict):
        return {k: hide_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [hide_paths(v) for v in value]
    if not isinstance(value, str) or not ("/" in value or "\\" in value):
        return value
    parts = []
    for part in value.split(","):
        key, eq, path = part.rpartition("=")
        if os.path.isabs(path.strip()) or path.strip().startswith("~"):
            path = Path(path.strip()).name
        parts.append(key + eq + path)
    return ",".join(parts)


# --------------------------------------------------------------------------------------------
# running the app


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one). Binding here, not in
    uvicorn, turns a busy port into an OSError the CLI prints in one line."""
    if not host.strip():  # the socket would listen on every interface, unasked
        raise ValueError(
            "the host is empty: give the address to listen on (127.0.0.1: this machine "
            "only; 0.0.0.0: every interface)"
        )
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"the port must be between 0 and 65535 (0: any free one), got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say they are
    # TCP; with proto 0 every answer waited ~40 ms for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _server(app: FastAPI, log_level: str):
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_keep_alive=30))


def serve(
    index_path: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    device: str = "cpu",
    run: str | None = None,
    captioner: str | None = None,
    log_level: str = "info",
    on_ready: Callable[[str], None] = print,
    verify: bool = False,
    allow_hosts: Sequence[str] = (),
    **limits: int,
) -> None:
    """Bind ``host:port``, open the index and serve until interrupted. ``on_ready`` gets the
    page's URL (the CLI prints it). The port is bound first so that a busy one fails before
    the model loads. ``verify``: check every index file's SHA-256 first. Requests may name
    this machine as ``localhost``, its loopback or bind address, or one of ``allow_hosts``.
    ``limits``: create_app's (max_image_pixels, decode_workers, decode_queue ...).
    ``captioner``: a run that writes captions for ``POST /api/describe`` (default: the
    index's own run, if it writes)."""
    from mmptm.search.index import SearchIndex

    sock = bind(host, port)
    try:
        index = SearchIndex.open(index_path, device=device, run=run, verify=verify)
        describer = describer_for(index, captioner, device)
        app = create_app(index, allowed_hosts=[*LOCAL_HOSTS, host, *allow_hosts],
                         describer=describer, **limits)  # fmt: skip
    except BaseException:
        sock.close()
        raise
    if not ipaddress.ip_address(sock.getsockname()[0]).is_loopback:
        log.warning("listening on %s: anyone who can reach it can query the index", host)
    on_ready(url_of(sock))
    # uvicorn shuts down gracefully on Ctrl+C, then raises it again: that is the normal end
    with contextlib.suppress(KeyboardInterrupt):
        _server(app, log_level).run(sockets=[sock])


@contextlib.contextmanager
def running(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` from a background thread; yields its URL, stops it on exit."""
    sock = bind(host, port)
    server = _server(app, "warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


# --------------------------------------------------------------------------------------------
# looking at the page headlessly (the browser test, the docs' screenshot)

#: Debian's ``chromium`` package
CHROMIUM = "/usr/bin/chromium"
#: headless and quiet: without the networking flags Chromium keeps calling Google's services
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


@contextlib.contextmanager
def chromium(profile: str | Path, executable: str = CHROMIUM, **options: Any) -> Iterator[Any]:
    """A headless Chromium with a fresh profile in ``profile``, driven by Playwright (a dev
    dependency); yields its BrowserContext. ``options``: Playwright's context options
    (``viewport`` ...)."""
    if not Path(executable).exists():
        raise FileNotFoundError(
            f"no Chromium at {executable}: install Debian's (apt-get install -y chromium "
            "chromium-driver) or give the path of another"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=executable, headless=True, args=list(CHROMIUM_FLAGS),
            **options,
        )  # fmt: skip
        try:
            yield context
        finally:
            context.close()
