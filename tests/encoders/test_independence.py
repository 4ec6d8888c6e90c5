"""Every registered encoder's module is in the import-linter contract that keeps the encoder
plug-ins from importing each other (pyproject.toml)."""

from __future__ import annotations

import tomllib
from conftest import ROOT

from mmptm.registry import ENCODERS


def test_every_encoder_plugin_is_in_the_independence_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (listed,) = [set(c["modules"]) for c in contracts if c["name"].startswith("encoder plug-ins")]
    modules = {ENCODERS.get(name).__module__ for name in ENCODERS.names()}
    assert {m for m in modules if m.startswith("mmptm.encoders.")} == listed
