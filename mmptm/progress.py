"""Progress of long loops: a tqdm bar on a terminal, a log line every N steps anywhere else.

A bar redrawn on a terminal becomes one line per redraw in a file, a CI log or a tool's
capture; there, the same object writes a log line (``mmptm.progress``, INFO) every ``every``
updates (or ``interval_s`` seconds) and one at the end. ``MMPTM_PROGRESS`` chooses:

- ``auto`` (default): a bar when stderr is a terminal, else lines;
- ``bar``, ``lines``: that, whatever stderr is;
- ``off``: nothing (as ``enabled=False``).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

log = logging.getLogger(__name__)

ENV = "MMPTM_PROGRESS"
MODES = ("auto", "bar", "lines", "off")


class Progress(Protocol):
    """What callers use of a progress object (a subset of tqdm's interface)."""

    n: int

    def update(self, n: int = 1) -> Any: ...
    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> Any: ...
    def close(self) -> None: ...
    def __iter__(self) -> Iterator[Any]: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> Any: ...


def progress_mode(mode: str = "") -> str:
    """``bar``, ``lines`` or ``off``: ``mode``, else ``$MMPTM_PROGRESS``, else ``auto``
    resolved by whether stderr is a terminal."""
    chosen = (mode or os.environ.get(ENV, "") or "auto").strip().lower()
    if chosen not in MODES:
        raise ValueError(f"{ENV}={chosen!r}: expected one of {', '.join(MODES)}")
    if chosen == "auto":
        isatty = getattr(sys.stderr, "isatty", None)
        return "bar" if isatty is not None and isatty() else "lines"
    return chosen


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    initial: int = 0,
    every: int = 0,
    interval_s: float = 30.0,
    leave: bool = True,
    enabled: bool = True,
    mode: str = "",
) -> Progress:
    """A progress object over ``iterable`` (or updated by hand up to ``total``).

    ``every``: in lines mode, a line each time the count reaches a multiple of it (the
    trainer passes ``train.log_every``); 0 = a line every ``interval_s`` seconds instead.
    ``leave=False``: an inner loop's bar, which leaves no last line. ``mode``: as
    ``$MMPTM_PROGRESS``, which it overrides.
    """
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    chosen = progress_mode(mode) if enabled else "off"
    if chosen == "bar":
        return _Bar(iterable, total=total, desc=desc, unit=unit, initial=initial, leave=leave,
                    dynamic_ncols=True)  # fmt: skip
    if chosen == "lines":
        return LineProgress(iterable, total=total, desc=desc, unit=unit, initial=initial,
                            every=every, interval_s=interval_s, leave=leave)  # fmt: skip
    return tqdm(iterable, total=total, disable=True)


#: bars open now; log records go around them (through ``tqdm.write``) while any is
_open_bars: list[Any] = []
_redirect: Any = None


class _Bar(tqdm):
    """A tqdm bar that routes log records around itself while it is open (else a warning
    printed mid-bar leaves half a bar behind)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        global _redirect
        super().__init__(*args, **kwargs)
        if not _open_bars:
            _redirect = logging_redirect_tqdm()
            _redirect.__enter__()
        _open_bars.append(self)

    def close(self) -> None:
        global _redirect
        super().close()
        if self in _open_bars:
            _open_bars.remove(self)
            if not _open_bars and _redirect is not None:
                _redirect.__exit__(None, None, None)
                _redirect = None


def _clock(seconds: float) -> str:
    """``h:mm:ss`` or ``m:ss``."""
    if not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class LineProgress:
    """tqdm's interface, shown as log lines: ``desc: unit n/total (pct) postfix | rate,
    elapsed, ETA``. The rate (and the ETA from it) is the pace since the previous line, as a
    bar shows a recent rate: a slow start (loader workers, a first shard) fades out."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        total: int | None = None,
        desc: str = "",
        unit: str = "it",
        initial: int = 0,
        every: int = 0,
        interval_s: float = 30.0,
        leave: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.iterable = iterable
        self.total, self.desc, self.unit = total, desc, unit
        self.n = self.initial = initial
        self.every, self.interval_s, self.leave = every, interval_s, leave
        self.clock = clock
        self.start = self.last_time = clock()
        self.last_n = initial  # the count the last line showed
        self.postfix = ""
        self.closed = False

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("this progress object was given no iterable")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        before, self.n = self.n, self.n + n
        if self.every > 0:
            due = self.n // self.every > before // self.every
        else:
            due = self.clock() - self.last_time >= self.interval_s
        if due:
            self._emit()

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = " ".join(f"{k}={v}" for k, v in items.items())

    def set_description(self, desc: str = "", refresh: bool = True) -> None:
        self.desc = desc

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.leave and self.n != self.last_n:
            self._emit()

    def line(self) -> str:
        """What the next log line says."""
        now = self.clock()
        span = now - self.last_time
        rate = (self.n - self.last_n) / span if span > 0 else math.nan
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        parts = [f"{self.desc}: {self.unit} {count}{pct}" if self.desc else f"{count}{pct}"]
        if self.postfix:
            parts.append(self.postfix)
        timing = f"{rate:.3g} {self.unit}/s, elapsed {_clock(now - self.start)}"
        if self.total and self.n < self.total:
            eta = (self.total - self.n) / rate if rate > 0 else math.inf
            timing += f", ETA {_clock(eta)}"
        return " ".join(parts) + " | " + timing

    def _emit(self) -> None:
        log.info("%s", self.line())
        self.last_n, self.last_time = self.n, self.clock()
