"""The house's layout, read from the imports: the simulator in ``torch_mingle/testing`` is
for tests, the swarm and benchmarks only, and no module of the package may import it."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "torch_mingle"


@functools.cache
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


#: The sans-I/O core: the node, its roles and parts, the election, the leader's term, the
#: follower's session, the rounds and their rules, the ballot, the frames and the wire codec.
CORE = (
    "_node", "_ready", "_roles", "_leading", "_following", "_joining", "_requests", "_cuts",
    "_snapshot", "_advice", "_settings", "_view", "_protocol", "_claims", "_leader", "_member",
    "_door", "_desk", "_proposals", "_ports", "_push", "_jobs", "_rounds", "_ledger", "_others",
    "_quorum", "_records", "_keys", "_follower", "_evidence", "_ballot", "_frames", "_wire",
    "_places", "_record", "_notes", "_errors", "_failpoints", "_ahead", "_world", "_agent", "_jobview",
)  # fmt: skip
#: What the core may not reach, directly or through another module of the package.
BANNED = ("threading", "_thread", "time", "datetime", "selectors", "socket", "select", "torch", "asyncio")


def _package_imports(name: str) -> set[str]:
    """The package's modules that ``name`` imports (at the top or inside a function)."""
    found = set()
    for imported in _imports(PACKAGE / f"{name}.py"):
        parts = imported.split(".")
        if parts[0] == "torch_mingle" and len(parts) > 1 and (PACKAGE / f"{parts[1]}.py").exists():
            found.add(parts[1])
    return found - {name}


def _reach(name: str) -> dict[str, list[str]]:
    """Every package module ``name`` reaches, with the path of imports that gets there."""
    paths: dict[str, list[str]] = {name: [name]}
    todo = [name]
    while todo:
        here = todo.pop()
        for there in sorted(_package_imports(here)):
            if there not in paths:
                paths[there] = [*paths[here], there]
                todo.append(there)
    return paths


def test_the_core_reaches_no_thread_no_clock_no_socket_and_no_torch():
    """Not itself, and not through any module it imports: time comes in as ``now``, sockets are
    the shell's, and torch's errors are the handler's (the core raises ``_errors.StateError``)."""
    offenders = {}
    for name in CORE:
        for module, path in _reach(name).items():
            bad = sorted(n for n in _imports(PACKAGE / f"{module}.py") if n.split(".")[0] in BANNED)
            if bad:
                offenders[" -> ".join(path)] = bad
    assert offenders == {}


def test_the_core_is_closed():
    """Nothing the core imports lies outside it, so the list above is the whole core."""
    outside = {name: sorted(_package_imports(name) - set(CORE)) for name in CORE}
    assert {k: v for k, v in outside.items() if v} == {}


def test_no_module_imports_itself_back():
    """No circle of imports, at the top of a module or inside a function."""
    modules = [p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"]
    circles = sorted(
        " -> ".join([*path, name])
        for name in modules
        for module, path in _reach(name).items()
        if module != name and name in _package_imports(module)
    )
    assert circles == []
