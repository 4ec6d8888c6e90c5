"""The house plan holds: no import cycles in mmptm, and the import-linter layer contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def test_no_import_cycles():
    graph = grimp.build_graph("mmptm")
    cycles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                cycles.append(" -> ".join((module, *back)))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_layer_contract_is_kept():
    # lint-imports reads [tool.importlinter] in pyproject.toml: upper floors import lower ones.
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "BROKEN" not in done.stdout and "1 kept, 0 broken" in done.stdout
