"""Shards that are not local files: ``http(s)://`` URLs, webdataset's ``pipe:COMMAND``, and
object storage (``s3://``, ``gs://``, ``az://``, any fsspec protocol) through fsspec.

:func:`open_shard` reads a remote shard as a stream: a thread fetches it ahead in chunks; a
read that fails, or brings no byte for ``timeout_s`` seconds, is tried again ``retries``
times with a doubling pause, from the byte where it stopped (an HTTP range request, a seek,
or the stream read again and its start dropped). A shard that still fails raises
:class:`ShardUnavailable`, and the pipeline skips and counts it like a corrupt shard: a
network fault costs samples and a warning, never a hang. With ``cache_dir`` every shard read
to its end is kept in a local folder of bounded size, so later epochs read it from disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import queue
import re
import secrets
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

__all__ = [
    "RemoteOptions",
    "RemoteStream",
    "ShardUnavailable",
    "check_backend",
    "is_remote",
    "open_shard",
    "open_source",
]

log = logging.getLogger(__name__)

_REMOTE = re.compile(r"^(pipe:|[A-Za-z][A-Za-z0-9+.-]*://)")
#: how to get fsspec's object-storage backends (pyproject.toml's ``remote`` extra)
EXTRA = "pip install 'mmptm[remote]'"
#: bytes a fetcher thread asks for at a time (and the read buffer of a stream)
CHUNK = 1 << 20
#: chunks a fetcher thread holds ahead of the reader
AHEAD = 8
#: bytes read past the end of the tar archive to reach the end of the stream (a streaming
#: tar reader stops at the end-of-archive marker, before the padding): a shard is cached only
#: once read to its end
_DRAIN = 1 << 20


def is_remote(url: str) -> bool:
    """Whether a shard URL is read through this module (``pipe:`` or ``scheme://``)."""
    return _REMOTE.match(url) is not None


def _protocol(url: str) -> str:
    return "pipe" if url.startswith("pipe:") else url.split("://", 1)[0].lower()


def check_backend(url: str) -> None:
    """Fail in one line if nothing here can read ``url`` (an fsspec protocol whose package
    is not installed, or an unknown one); http(s) and ``pipe:`` need nothing."""
    protocol = _protocol(url)
    if protocol in ("pipe", "http", "https"):
        return
    try:
        import fsspec
    except ImportError:
        raise ValueError(f"{url}: reading {protocol}:// shards needs fsspec ({EXTRA})") from None
    try:
        fsspec.get_filesystem_class(protocol)
    except ImportError as e:
        raise ValueError(
            f"{url}: reading {protocol}:// shards needs fsspec's backend for it ({EXTRA}): {e}"
        ) from None
    except ValueError:
        raise ValueError(
            f"{url}: unknown protocol {protocol}:// (http(s)://, pipe:, or an fsspec protocol "
            "such as s3://, gs://, az://)"
        ) from None


@dataclass(frozen=True)
class RemoteOptions:
    """How remote shards are read (``data.retries``, ``data.timeout_s``, ``data.cache_dir``)."""

    #: further tries after a read that failed or stalled
    retries: int = 3
    #: seconds without a byte (or a connection) before a read counts as stalled
    timeout_s: float = 60.0
    #: pause before the first retry, seconds; it doubles with every further one
    backoff_s: float = 1.0
    #: a local folder that keeps shards read to their end ("" = no cache)
    cache_dir: str = ""
    #: the cache's bound in GB: the least recently read shards are removed past it
    cache_gb: float = 100.0


class ShardUnavailable(OSError):
    """A remote shard that could not be read: gone (HTTP 404), or failing past the retries."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        #: the one-line message (readers append to ``args`` as the error travels)
        self.detail = detail


# --------------------------------------------------------------------------------------------
# Sources: one attempt at reading a shard from a byte offset


class Source(Protocol):
    """One connection to a shard: ``read`` gives the bytes available (b"" at the end)."""

    def read(self, n: int) -> bytes: ...

    def close(self) -> None: ...


class _HTTP:
    def __init__(self, url: str, pos: int, timeout: float) -> None:
        headers = {"User-Agent": "mmptm"}
        if pos:
            headers["Range"] = f"bytes={pos}-"
        request = urllib.request.Request(url, headers=headers)
        self.response = urllib.request.urlopen(request, timeout=timeout)
        if pos and self.response.status != 206:  # the server ignored the range
            _drop(self, pos)

    def read(self, n: int) -> bytes:
        data = self.response.read1(n)
        if not data and self.response.length:  # http.client takes a cut for the end
            raise OSError(f"the connection closed {self.response.length} bytes before the end")
        return data

    def close(self) -> None:
        self.response.close()


class _Pipe:
    def __init__(self, command: str, pos: int) -> None:
        self.command = command
        # its own session: closing ends the shell and what it started (aws, gsutil, curl)
        self.process = subprocess.Popen(
            command, shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        self.stdout = self.process.stdout
        _drop(self, pos)

    def read(self, n: int) -> bytes:
        data = self.stdout.read1(n)
        if not data:
            status = self.process.wait()
            if status:
                raise OSError(f"`{self.command}` exited with status {status}")
        return data

    def kill(self) -> None:
        """End the command (and what it started): a blocked read returns."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        self.stdout.close()
        self.process.wait()


class _Fsspec:
    def __init__(self, url: str, pos: int) -> None:
        import fsspec

        self.file = fsspec.open(url, "rb").open()
        if pos:
            self.file.seek(pos)

    def read(self, n: int) -> bytes:
        return self.file.read(n)

    def close(self) -> None:
        self.file.close()


def _drop(source: Source, count: int) -> None:
    """Read and drop the first ``count`` bytes of a source that cannot start further on."""
    while count > 0:
        data = source.read(min(count, CHUNK))
        if not data:
            raise OSError(f"the stream ended before byte {count}")
        count -= len(data)


def open_source(url: str, pos: int, timeout: float) -> Source:
    """A new connection to the shard ``url``, at byte ``pos``."""
    protocol = _protocol(url)
    if protocol == "pipe":
        return _Pipe(url[len("pipe:") :], pos)
    if protocol in ("http", "https"):
        return _HTTP(url, pos, timeout)
    return _Fsspec(url, pos)


#: opens a source: (url, byte offset, timeout in seconds)
Opener = Callable[[str, int, float], Source]


def _permanent(e: BaseException) -> bool:
    """A failure that another try would meet again (a 404, a missing object)."""
    if isinstance(e, urllib.error.HTTPError):
        return 400 <= e.code < 500 and e.code not in (408, 425, 429)
    return isinstance(e, FileNotFoundError | PermissionError)


def _what(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    text = str(e) or type(e).__name__
    return f"{type(e).__name__}: {text}" if isinstance(e, TimeoutError) else text


# --------------------------------------------------------------------------------------------
# The stream: a fetcher thread per attempt, retries, the cache


class _Fetcher:
    """One attempt: a thread that opens the source and queues its chunks ahead of the reader.
    A stalled attempt is abandoned (see :meth:`stop`)."""

    def __init__(self, opener: Opener, url: str, pos: int, timeout: float) -> None:
        self.chunks: queue.Queue[bytes | BaseException] = queue.Queue(AHEAD)
        self.stopped = threading.Event()
        self.source: Source | None = None
        args = (opener, url, pos, timeout)
        self.thread = threading.Thread(target=self._run, args=args, daemon=True)
        self.thread.start()

    def _run(self, opener: Opener, url: str, pos: int, timeout: float) -> None:
        try:
            self.source = opener(url, pos, timeout)
            while not self.stopped.is_set():
                data = self.source.read(CHUNK)
                self._put(data)
                if not data:
                    break
        except BaseException as e:  # handed to the reader, which decides
            self._put(e)
        finally:
            self._close()

    def _put(self, item: bytes | BaseException) -> None:
        while not self.stopped.is_set():
            try:
                self.chunks.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def get(self, timeout: float) -> bytes:
        """The next chunk (b"" at the end); the source's error, or TimeoutError."""
        try:
            item = self.chunks.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no data for {timeout:g} s") from None
        if isinstance(item, BaseException):
            raise item
        return item

    def stop(self) -> None:
        """Abandon the attempt: its thread closes the source and ends. A command is killed
        now; a connection ends at its socket's timeout (closing it from this thread would
        wait for the read that holds it)."""
        self.stopped.set()
        source = self.source
        if isinstance(source, _Pipe):
            source.kill()

    def _close(self) -> None:
        source, self.source = self.source, None
        if source is not None:
            # closing a broken connection may fail; it is dropped anyway
            with contextlib.suppress(Exception):
                source.close()


class RemoteStream(io.RawIOBase):
    """A remote shard as a readable stream, with retries, a timeout, and optionally a copy
    written to ``cache`` (kept once the stream was read to its end)."""

    def __init__(
        self,
        url: str,
        opts: RemoteOptions,
        cache: Path | None = None,
        opener: Opener = open_source,
    ) -> None:
        self.url = url
        self.opts = opts
        self._opener = opener
        self._fetcher: _Fetcher | None = None
        self._buf = memoryview(b"")
        self._received = 0  # bytes taken from fetchers: where a new attempt starts
        self._failures = 0  # failed attempts since the last byte
        self._failed: ShardUnavailable | None = None
        self._eof = False
        self._cache = cache
        self._tmp: Path | None = None
        self._copy: BinaryIO | None = None
        if cache is not None:
            self._tmp = cache.parent / f".{cache.name}.{secrets.token_hex(4)}.tmp"
            self._copy = open(self._tmp, "wb")  # noqa: SIM115 (closed by close())

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        while not self._buf:
            if self._eof:
                return 0
            self._buf = memoryview(self._next())
            self._eof = not self._buf
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def _next(self) -> bytes:
        """The next chunk from the current attempt, starting new ones as failures allow."""
        if self._failed is not None:  # a reader that goes on after the error gets it again
            raise self._failed
        while True:
            if self._fetcher is None:
                # no reference to self in the thread: a stream its reader drops is collected
                # (and closed), which ends the thread
                timeout = self.opts.timeout_s
                self._fetcher = _Fetcher(self._opener, self.url, self._received, timeout)
            try:
                data = self._fetcher.get(self.opts.timeout_s)
            except Exception as e:
                self._fetcher.stop()
                self._fetcher = None
                self._retry_or_fail(e)
                continue
            self._failures = 0
            self._received += len(data)
            self._keep(data)
            return data

    def _retry_or_fail(self, e: Exception) -> None:
        self._failures += 1
        if _permanent(e) or self._failures > self.opts.retries:
            tries = "" if _permanent(e) else f" ({self._failures} tries)"
            at = f" at byte {self._received}" if self._received else ""
            self._failed = ShardUnavailable(f"{self.url}: {_what(e)}{at}{tries}")
            raise self._failed from e
        pause = self.opts.backoff_s * 2 ** (self._failures - 1)
        log.info("%s: %s; trying again in %g s", self.url, _what(e), pause)
        time.sleep(pause)

    def _keep(self, data: bytes) -> None:
        """Copy a chunk into the cache file; the shard is published in the cache at its end."""
        if self._copy is None:
            return
        try:
            if data:
                self._copy.write(data)
                return
            self._copy.close()
            self._copy = None
            assert self._tmp is not None and self._cache is not None
            os.replace(self._tmp, self._cache)
            self._tmp = None
            _evict(self._cache.parent, self.opts.cache_gb, keep=self._cache)
        except OSError as e:  # a full disk: the shard is read all the same, not cached
            log.warning("not caching %s in %s: %s", self.url, self.opts.cache_dir, e)
            self._drop_copy()

    def _drop_copy(self) -> None:
        if self._copy is not None:
            self._copy.close()
            self._copy = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None

    def close(self) -> None:
        if self.closed:
            return
        if self._copy is not None and self._failed is None:
            # the tar reader stops at the end-of-archive marker: read the padding after it
            # (bounded, so that a shard left mid-way is not read to its end) to cache it
            try:
                self._buf = memoryview(b"")
                left = _DRAIN
                while left > 0 and not self._eof:
                    data = self._next()
                    self._eof = not data
                    left -= len(data)
            except OSError:
                pass
        self._drop_copy()
        if self._fetcher is not None:
            self._fetcher.stop()
            self._fetcher = None
        super().close()


def open_shard(url: str, opts: RemoteOptions) -> BinaryIO:
    """A remote shard for reading: from the cache when it holds it, else streamed (and
    copied into the cache, with ``opts.cache_dir``)."""
    cache = None
    if opts.cache_dir:
        cache = Path(opts.cache_dir) / _cache_name(url)
        try:
            f = open(cache, "rb")  # noqa: SIM115 (the caller's stream)
            os.utime(cache)  # recently used: evicted last
            return f
        except FileNotFoundError:
            cache.parent.mkdir(parents=True, exist_ok=True)
    return io.BufferedReader(RemoteStream(url, opts, cache), CHUNK)


def _cache_name(url: str) -> str:
    """A file name per URL: a hash (URLs differ in more than their last part) and the name."""
    last = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[-80:]
    return f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{last}"


def _evict(folder: Path, limit_gb: float, keep: Path) -> None:
    """Remove the least recently used shards of the cache until it holds at most
    ``limit_gb``, and temporary files a killed process left a day ago."""
    limit = limit_gb * 1e9
    now = time.time()
    files = []
    for entry in os.scandir(folder):
        if not entry.is_file():
            continue
        st = entry.stat()
        if entry.name.startswith("."):
            if entry.name.endswith(".tmp") and now - st.st_mtime > 86400:
                Path(entry.path).unlink(missing_ok=True)
            continue
        files.append((st.st_mtime, st.st_size, Path(entry.path)))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= limit:
            break
        if path != keep:
            # a reader that has it open reads on (POSIX); the next one downloads it again
            path.unlink(missing_ok=True)
            total -= size
