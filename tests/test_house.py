"""What keeps the house in order, checked on every run (fast: the quick lane): the API's paths
as the code routes them and as its OpenAPI document describes them are the same, and CI runs
every check the project claims (lint, format, types, import contracts, tests)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from controller._api.openapi import OPENAPI
from controller._api.routes import _ROUTES

ROOT = Path(__file__).parent.parent
_METHODS = {"get", "put", "post", "delete", "patch"}


def _sample(path: str) -> str:
    """A path of the document with a value in each of its parameters."""
    return re.sub(r"\{[^}]+\}", "x", path)


def test_every_documented_path_is_routed_with_exactly_its_methods() -> None:
    for path, operations in OPENAPI["paths"].items():
        routed = [r for r in _ROUTES if r.pattern.fullmatch(_sample(path))]
        assert len(routed) == 1, f"{path}: routed by {len(routed)} patterns"
        documented = {m.upper() for m in operations if m in _METHODS}
        # HEAD goes wherever GET does, undocumented (as in most APIs' documents).
        assert set(routed[0].methods) - {"HEAD"} == documented, path


def test_every_route_is_documented() -> None:
    paths = [_sample(p) for p in OPENAPI["paths"]]
    undocumented = [
        r.pattern.pattern for r in _ROUTES if not any(r.pattern.fullmatch(p) for p in paths)
    ]
    assert undocumented == []


def test_ci_runs_lint_format_types_import_contracts_and_the_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"nox -s lint typecheck tests\b", ci), ci
    noxfile = (ROOT / "noxfile.py").read_text()
    lint = noxfile.split("def lint(", 1)[1].split("\n@nox.session", 1)[0]
    for check in ('"ruff", "check"', '"ruff", "format", "--check"', '"lint-imports"'):
        assert check in lint, check


def test_a_runtimes_optional_parts_are_found_only_in_the_ports() -> None:
    # A runtime's nodes, batched checks and logs, and what a listener takes, are found by their
    # protocols in `_ports/runtime.py` (`node_runtime`, `batched_checks`, `log_source`,
    # `tell_load`, `tell_nodes_changed`), never by a name looked up where they are used.
    by_name = re.compile(r"getattr\((self\.)?(_?runtime|inner|_on_death|listener)\b")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "controller").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if by_name.search(line)
    ]
    assert found == []


def _imports() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports, those imported only
    for type checkers included."""
    modules: dict[str, Path] = {}
    for path in (ROOT / "controller").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)]
                target = ".".join([*base, node.module] if node.module else base)
                if not node.level:
                    target = node.module or ""
                found |= {target, *(f"{target}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_no_module_imports_itself_through_others() -> None:
    # An import circle, even one for type checkers only, is two modules that cannot be read
    # (or moved) apart. A package's `__init__` stands apart: it lists its public names.
    graph = _imports()
    inits = {m for m in graph if (ROOT / m.replace(".", "/") / "__init__.py").exists()}
    circles = []
    for start in sorted(graph):
        seen: set[str] = set()
        todo = [d for d in graph[start] if d not in inits]
        while todo:
            module = todo.pop()
            if module == start:
                circles.append(start)
                break
            if module not in seen:
                seen.add(module)
                todo.extend(d for d in graph[module] if d not in inits)
    assert circles == []
