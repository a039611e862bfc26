"""The house's layout, read from the imports: the simulator in ``torch_mingle/testing`` is
for tests, the swarm and benchmarks only, and no module of the package may import it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "torch_mingle"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_nothing_in_the_package_imports_the_simulator():
    production = [p for p in PACKAGE.rglob("*.py") if "testing" not in p.relative_to(PACKAGE).parts]
    assert len(production) > 20
    offenders = {
        str(p.relative_to(PACKAGE)): sorted(n for n in _imports(p) if n.startswith("torch_mingle.testing"))
        for p in production
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_node_and_its_parts_import_no_thread_no_clock_and_no_torch_directly():
    """What the node's protocol parts import themselves (``errors`` still brings torch's
    exception classes in: the core raises ``MingleStateError``)."""
    core = [
        "_node",
        "_leader",
        "_follower",
        "_rounds",
        "_records",
        "_quorum",
        "_ledger",
        "_ballot",
        "_protocol",
        "_frames",
        "_notes",
        "_evidence",
    ]
    banned = ("threading", "time", "selectors", "socket", "torch")
    found = {
        name: sorted(n for n in _imports(PACKAGE / f"{name}.py") if n.split(".")[0] in banned)
        for name in core
    }
    assert {k: v for k, v in found.items() if v} == {}
