"""benchmarks/bench_vl.py and bench_clip.py run at toy shapes, and their FLOP counts say what
each side computes: HF's pre-training heads run at every position, mmptm's at the masked ones;
at full-length captions mmptm's CLIP and open_clip's compute the same shapes."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

TOY = ["--rounds", "1", "--steps", "1", "--warmup", "1", "--threads", "1"]


def test_bench_vl_counts_hf_heads_at_every_position():
    pytest.importorskip("transformers")
    import bench_vl

    r = bench_vl.main(
        ["--batch", "4", "--seq", "16", "--regions", "6", "--feat", "32", "--hidden", "32",
         "--heads", "2", "--layers", "1", "--object-layers", "1", "--cross-layers", "1",
         "--vocab", "4000", "--classes", "50", *TOY]
    )  # fmt: skip
    # A vocabulary of 4000 over 16 tokens: HF's MLM decoder at all 16 positions alone is
    # 6·16·32·4000 FLOPs a sample, more than mmptm's whole step at these widths.
    assert r["flop_single"] > 2 and r["flop_two"] > 2
    assert r["single"] > 0 and r["two"] > 0


def test_bench_clip_equal_work_at_full_length_less_on_real_captions():
    pytest.importorskip("open_clip")
    import bench_clip

    r = bench_clip.main(["--model", "tiny", "--batch", "4", *TOY])
    full, caps = r["full"], r["captions"]
    assert full["tokens"] == [77, 77]
    assert full["gflop"]["mmptm"] == pytest.approx(full["gflop"]["open_clip"], rel=1e-3)
    # toyworld's captions are 20-35 tokens with open_clip's BPE: mmptm runs that many, not 77
    assert all(20 <= n <= 40 for n in caps["tokens"])
    assert caps["gflop"]["mmptm"] < caps["gflop"]["open_clip"]
    assert caps["gflop"]["open_clip"] == pytest.approx(full["gflop"]["open_clip"], rel=1e-6)
