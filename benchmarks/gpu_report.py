"""The GPU check's report: time limits per part, and the JSON and Markdown that are rewritten
as results come in (benchmarks/gpu_check.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class OutOfTime(Exception):
    """A part ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`OutOfTime` in this (main) thread after ``seconds``."""

    def alarm(signum, frame):
        raise OutOfTime(f"past its limit of {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Report:
    """The run's results: ``gpu_check.json`` and ``gpu_check.md`` in ``out``, rewritten as
    results come in."""

    def __init__(self, out: Path, meta: dict[str, Any], deadline: float) -> None:
        self.out = out
        self.deadline = deadline
        self.data: dict[str, Any] = {"meta": meta, "sections": {}}
        out.mkdir(parents=True, exist_ok=True)

    def write(self) -> None:
        for name, text in (
            ("gpu_check.json", json.dumps(self.data, indent=1, default=str)),
            ("gpu_check.md", markdown(self.data)),
        ):
            tmp = self.out / f".{name}.tmp"
            tmp.write_text(text + "\n", encoding="utf-8")
            os.replace(tmp, self.out / name)

    def run(self, name: str, cap: float, part: Callable[[dict[str, Any]], None]) -> None:
        """Run one part, which fills its record; an exception or the part's time limit
        (``cap`` seconds, less if the run's deadline comes first) ends the part, not the run."""
        rec: dict[str, Any] = {"status": "running"}
        self.data["sections"][name] = rec
        left = self.deadline - time.monotonic()
        limit = min(cap, left)
        print(f"\n== {name} (limit {limit:.0f} s, {left:.0f} s left in all)", flush=True)
        t0 = time.perf_counter()
        try:
            if limit < 5:
                raise OutOfTime("no time left")
            with time_limit(limit):
                part(rec)
            rec["status"] = "ok" if rec.get("ok", True) else "failed"
        except Exception as e:
            rec["status"] = "timeout" if isinstance(e, OutOfTime) else "error"
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc(limit=-8)
            print(rec["traceback"], flush=True)
        finally:
            rec["seconds"] = round(time.perf_counter() - t0, 1)
            print(f"== {name}: {rec['status']} in {rec['seconds']} s", flush=True)
            self.write()


def _fmt(x: Any, spec: str = ".3g") -> str:
    return "–" if x is None else format(x, spec)


def summary(name: str, r: dict[str, Any]) -> str:
    """One line of what a part found."""
    if "error" in r:
        return r["error"].splitlines()[0][:200]
    if name == "env":
        peak = _fmt(r.get("peak_tflops"))
        return f"{r.get('device_name')}, torch {r.get('torch')}, peak {peak} TFLOP/s"
    if name in ("precision", "compile", "fsdp"):
        d = r.get("max_rel_diff")
        line = f"max relative loss difference {_fmt(d)} (tolerance {_fmt(r.get('tolerance'))})"
        if name == "compile":
            line += (
                f"; compile {_fmt(r.get('compile_s'), '.1f')} s, steps/s eager "
                f"{_fmt(r.get('eager_steps_per_s'))} / compiled "
                f"{_fmt(r.get('compiled_steps_per_s'))}; graphs {r.get('graphs')}, "
                f"graph breaks {r.get('graph_breaks')}"
            )
        if name == "fsdp":
            line += (
                f"; {r.get('fsdp_units')} FSDP units, steps/s "
                f"{_fmt(r.get('plain_steps_per_s'))} plain / "
                f"{_fmt(r.get('fsdp_steps_per_s'))} sharded"
            )
        return line
    if name == "throughput":
        return f"{len(r.get('rows', []))} models (table below)"
    if name == "loader":
        return (
            f"steps/s {_fmt(r.get('loader_steps_per_s'))} loader / "
            f"{_fmt(r.get('memory_steps_per_s'))} memory (ratio {_fmt(r.get('ratio'))}), "
            f"waiting {_fmt(r.get('wait_s_per_step'))} s/step"
        )
    if name == "memory":
        return f"{len(r.get('rows', []))} recipes (table below)"
    return ""


def markdown(data: dict[str, Any]) -> str:
    """The run as Markdown: a line per part, then the throughput and memory tables."""
    meta, sec = data["meta"], data["sections"]
    env = sec.get("env", {})
    out = [
        f"# GPU check, {meta['started']}",
        "",
        f"`{meta['command']}` on {env.get('device_name', '?')} "
        f"(torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')})",
        "",
        "| part | status | seconds | result |",
        "|---|---|---|---|",
    ]
    for name, r in sec.items():
        out.append(f"| {name} | {r['status']} | {r.get('seconds', '')} | {summary(name, r)} |")
    rows = sec.get("throughput", {}).get("rows", [])
    if rows:
        out += [
            "",
            "| model | batch | steps/s | samples/s | TFLOP/step | TFLOP/s | MFU | peak GiB |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            mfu = None if r.get("mfu") is None else f"{r['mfu']:.1%}"
            out.append(
                f"| {r['model']} | {r['batch']} | {_fmt(r['steps_per_s'])} | "
                f"{_fmt(r['samples_per_s'])} | {_fmt(r['tflop_per_step'])} | "
                f"{_fmt(r['tflops'])} | {mfu or '–'} | {_fmt(r.get('peak_gib'))} |"
            )
        ratio = sec["throughput"].get("clip_ratio")
        if ratio:
            clip = data["meta"]["plan"]["clip"]
            out.append(f"\nCLIP {clip}, mmptm ÷ open_clip samples/s: **{ratio:.2f}**")
    mem = sec.get("memory", {}).get("rows", [])
    if mem:
        out += [
            "",
            "| recipe | batch | parameters (M) | peak memory GiB | note |",
            "|---|---|---|---|---|",
        ]
        for r in mem:
            out.append(
                f"| {r['recipe']} | {r.get('batch')} | {_fmt(r.get('params_m'), '.1f')} | "
                f"{_fmt(r.get('peak_gib'))} | {r.get('error', '')[:120]} |"
            )
    return "\n".join(out)
