"""The house plan holds: no import cycles in mmptm (the layer contract is `lint-imports`, run
by `make test` before pytest)."""

from __future__ import annotations

import grimp


def test_no_import_cycles():
    graph = grimp.build_graph("mmptm")
    cycles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                cycles.append(" -> ".join((module, *back)))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
