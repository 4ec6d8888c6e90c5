"""The wheel works outside the checkout: built, installed into a fresh virtual environment,
and used from an empty folder as a new user would (recipes by name, the demo, pre-training
on toyworld).

The fresh environment gets mmptm from the wheel alone; its dependencies (torch and the rest,
gigabytes that the offline CI cannot fetch again) are the test environment's, reached by a
path file, without that environment's editable install of the checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

import mmptm

pytestmark = pytest.mark.slow


def run(cmd: list[str], cwd: Path, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A new virtual environment with the wheel of this checkout installed; its ``bin``."""
    tmp = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp / "dist"), str(ROOT)], cwd=tmp)  # fmt: skip
    (wheel,) = (tmp / "dist").glob("mmptm-*.whl")
    assert wheel.name.startswith(f"mmptm-{mmptm.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mmptm/recipes/pretrain/clip_tiny.yaml" in names
    assert "mmptm/recipes/pretrain/_toyworld.yaml" in names
    assert "mmptm/search/static/index.html" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "docs/")) for n in names)
    env = tmp / "env"
    run([sys.executable, "-m", "venv", str(env)], cwd=tmp)
    py = env / "bin" / "python"
    site = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp)
    # the dependencies of this environment, not its editable mmptm (a path file adds a
    # folder, it does not run that folder's own path files)
    (Path(site.strip()) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=tmp)
    return env / "bin"


def test_wheel_from_an_empty_folder(fresh, tmp_path):
    where = run([str(fresh / "python"), "-c", "import mmptm; print(mmptm.__file__)"], tmp_path)
    assert not where.startswith(str(ROOT)) and str(fresh.parent) in where
    mmptm_cli = str(fresh / "mmptm")
    assert run([mmptm_cli, "--version"], tmp_path).strip() == f"mmptm {mmptm.__version__}"
    listed = json.loads(run([mmptm_cli, "recipes", "--json"], tmp_path))
    assert {"clip_tiny", "xnli", "hubert_tiny"} <= {r["name"] for r in listed}
    # the demo at toy size: toyworld, tokenizer, CLIP, retrieval, index
    run([mmptm_cli, "demo", "--n-train", "64", "--n-test", "16", "--steps", "3",
         "--out", "demo"], tmp_path)  # fmt: skip
    results = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert results
    # a recipe by name, on toyworld data where the recipe looks for it (data/toyworld)
    world = "data/toyworld"
    run([mmptm_cli, "data", "toyworld", "--out", world, "--n-train", "32", "--n-val", "8",
         "--n-test", "8", "--image-size", "32", "--no-progress"], tmp_path)  # fmt: skip
    run([mmptm_cli, "tokenizer", "train", "--input", f"{world}/image_text/train-*.tar",
         "--out", f"{world}/tokenizer", "--vocab-size", "300"], tmp_path)  # fmt: skip
    out = run([mmptm_cli, "pretrain", "clip_tiny", "output_dir=runs/clip", "train.max_steps=2",
               "data.batch_size=8", "data.num_workers=0", "train.progress=false",
               "model.encoders.image.backbone.image_size=32"], tmp_path)  # fmt: skip
    assert json.loads(out.strip().splitlines()[-1])["step"] == 2
    assert list((tmp_path / "runs" / "clip" / "checkpoints").glob("step_*.pt"))
