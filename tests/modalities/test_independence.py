"""Every registered modality's module is in the import-linter contract that keeps the
modality plug-ins from importing each other (pyproject.toml)."""

from __future__ import annotations

import tomllib
from conftest import ROOT

from mmptm.registry import MODALITIES


def test_every_modality_plugin_is_in_the_independence_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (listed,) = [set(c["modules"]) for c in contracts if c["name"].startswith("modality plug-")]
    modules = {MODALITIES.get(name).__module__ for name in MODALITIES.names()}
    assert {m for m in modules if m.startswith("mmptm.modalities.")} == listed
