"""benchmarks/gpu_check.py runs end to end on CPU (``--smoke``) and its report survives a part
that fails or runs out of time."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_report import Report, markdown


@pytest.mark.slow
def test_smoke_run_fills_every_part(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # the script finds the repository itself
    )
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    sec = data["sections"]
    assert list(sec) == ["env", "precision", "throughput", "compile", "fsdp", "loader", "memory"]
    assert {n: r["status"] for n, r in sec.items()} == dict.fromkeys(sec, "ok"), done.stdout[-3000:]
    assert done.returncode == 0

    # bf16 autocast did run (the curves differ) and agrees with fp32; both learned
    p = sec["precision"]
    assert len(p["fp32_losses"]) == len(p["bf16_losses"]) == data["meta"]["plan"]["check_steps"]
    assert 0 < p["max_rel_diff"] <= p["tolerance"] and p["learned"]
    # the eager backend and FSDP over one rank in fp32 compute the same numbers as eager
    assert sec["compile"]["max_rel_diff"] == 0 and sec["compile"]["graphs"] >= 1
    assert sec["fsdp"]["max_rel_diff"] < 1e-6 and sec["fsdp"]["fsdp_units"] > 1

    rows = {r["model"]: r for r in sec["throughput"]["rows"]}
    assert set(rows) == {"visualbert_tiny", "lxmert_tiny", "CLIP tiny mmptm", "CLIP tiny open_clip"}
    for r in rows.values():
        assert r["steps_per_s"] > 0 and r["tflop_per_step"] > 0
        assert math.isclose(r["samples_per_s"], r["steps_per_s"] * r["batch"])
    # "equal shapes": both CLIP models do the same matrix products (counted independently)
    ours, theirs = rows["CLIP tiny mmptm"], rows["CLIP tiny open_clip"]
    assert math.isclose(ours["tflop_per_step"], theirs["tflop_per_step"], rel_tol=0.01)
    init = sec["throughput"]["clip_init_losses"]
    assert (
        abs(init["mmptm"] - init["ln_batch"]) < 1 and abs(init["open_clip"] - init["ln_batch"]) < 1
    )

    loader = sec["loader"]
    assert loader["loader_steps_per_s"] > 0 and loader["memory_steps_per_s"] > 0
    assert loader["batch_mb"] > 0
    memory = sec["memory"]["rows"][0]
    assert memory["recipe"] == "clip_tiny" and memory["peak_mb"] > memory["start_mb"] > 0
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| precision | ok |" in md and "CLIP tiny, mmptm ÷ open_clip" in md


def test_a_failing_or_late_part_leaves_the_others(tmp_path):
    report = Report(tmp_path, {"command": "x", "started": "now", "plan": {"clip": "c"}}, 1e12)

    def fails(rec):
        raise ValueError("bad numbers")

    report.run("env", 10, lambda rec: rec.update(device_name="d"))
    report.run("precision", 10, fails)
    report.run("compile", 0.2, lambda rec: time.sleep(2))  # interrupted by its time limit
    report.run("fsdp", 10, lambda rec: rec.update(ok=False))
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    states = {n: r["status"] for n, r in data["sections"].items()}
    assert states == {"env": "ok", "precision": "error", "compile": "timeout", "fsdp": "failed"}
    assert data["sections"]["precision"]["error"] == "ValueError: bad numbers"
    assert data["sections"]["compile"]["seconds"] < 1.5
    md = markdown(data)
    assert "| precision | error |" in md and "bad numbers" in md


def test_no_time_left_skips_a_part(tmp_path):
    report = Report(tmp_path, {"command": "x", "started": "now", "plan": {}}, time.monotonic())
    ran = []
    report.run("env", 10, lambda rec: ran.append(1))
    assert not ran
    sections = json.loads((tmp_path / "gpu_check.json").read_text())["sections"]
    assert sections["env"]["status"] == "timeout" and "no time left" in sections["env"]["error"]
