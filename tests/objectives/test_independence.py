"""Every registered objective's module is in the import-linter contract that keeps the
objective plug-ins from importing each other (pyproject.toml)."""

from __future__ import annotations

import tomllib
from conftest import ROOT

from mmptm.registry import OBJECTIVES


def test_every_objective_plugin_is_in_the_independence_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["name"].startswith("objective plug-ins")]
    assert contract["type"] == "independence"
    modules = {OBJECTIVES.get(name).__module__ for name in OBJECTIVES.names()}
    assert {m for m in modules if m.startswith("mmptm.objectives.")} == set(contract["modules"])
