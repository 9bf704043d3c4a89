"""What keeps the house in order, checked on every run (fast: the quick lane): the API's paths
as the code routes them and as its OpenAPI document describes them are the same, and CI runs
every check the project claims (lint, format, types, import contracts, tests)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import attrs

from controller._api.openapi import OPENAPI
from controller._api.routes import _ROUTES

ROOT = Path(__file__).parent.parent.parent
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


# -- docs/architecture.md names the house as it is --

ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "controller"


def _sections(text: str) -> dict[str, str]:
    """Each `### ` section of the page by its heading."""
    parts = re.split(r"^### (.+)$", text, flags=re.M)
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    return {heading: body.split("\n## ", 1)[0] for heading, body in pairs}


def _folders() -> list[Path]:
    """The package's folders, and the folders of Python modules in them (`_model/`'s kinds)."""
    top = [p for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"]
    inner = [p for folder in top for p in folder.iterdir() if (p / "__init__.py").exists()]
    return sorted(top + inner)


def test_the_architecture_names_every_folder_and_module_and_no_other() -> None:
    sections = _sections(ARCHITECTURE.read_text())
    for folder in [PACKAGE, *_folders()]:
        name = "controller/" if folder == PACKAGE else f"{folder.relative_to(PACKAGE)}/"
        (body,) = [b for h, b in sections.items() if f"`{name}`" in h] or [""]
        assert body, f"docs/architecture.md has no section for `{name}`"
        modules = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
        if folder == PACKAGE:
            modules |= {"worker.py"}  # also named in `_local/`'s section, which it shares
        named = set(re.findall(r"`([\w]+\.py)`", body))
        assert modules - named == set(), f"`{name}`: modules the page does not name"
        assert named - modules == set(), f"`{name}`: modules the page names that do not exist"


def _layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (floors,) = [c for c in contracts if c.get("containers") == ["controller"]]
    return [set(re.split(r"\s*[:|]\s*", layer.strip())) for layer in floors["layers"]]


def test_the_architectures_floors_are_the_import_contracts_layers() -> None:
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", ARCHITECTURE.read_text(), flags=re.M)
    table = {
        int(n): {u.strip("`").rstrip("/").removesuffix(".py") for u in re.findall(r"`[^`]+`", cell)}
        for n, cell in rows
    }
    layers = _layers()
    assert table == {len(layers) - i: units for i, units in enumerate(layers)}


def _folder_imports() -> set[tuple[str, str]]:
    """Which top-level folder or module of the package imports which, each arrow drawn once:
    none that a longer path already implies."""
    graph = _imports()
    unit = {m: m.split(".")[1] for m in graph if m.count(".") >= 1}
    merged = {"__main__": "_cli", "worker": "_local"}  # drawn as one box each
    edges = {
        (merged.get(unit[a], unit[a]), merged.get(unit[b], unit[b]))
        for a, deps in graph.items()
        if a in unit
        for b in deps
        if b in unit
    }
    edges = {(a, b) for a, b in edges if a != b}

    def reaches(a: str, b: str, without: tuple[str, str]) -> bool:
        todo, seen = [y for x, y in edges if x == a and (x, y) != without], set()
        while todo:
            here = todo.pop()
            if here == b:
                return True
            if here not in seen:
                seen.add(here)
                todo.extend(y for x, y in edges if x == here)
        return False

    return {e for e in edges if not reaches(*e, without=e)}


def test_the_architectures_drawing_has_the_arrows_the_code_has() -> None:
    text = ARCHITECTURE.read_text()
    drawing = text.split("```mermaid", 1)[1].split("```", 1)[0]
    boxes = {
        box: label.split()[0].rstrip("/").removesuffix(".py")
        for box, label in re.findall(r'(\w+)\["([^"]+)"\]', drawing)
    }
    arrows = {
        (boxes[a], boxes[b]) for a, b in re.findall(r"(\w+)(?:\[[^\]]*\])? --> (\w+)", drawing)
    }
    assert arrows == _folder_imports()


def test_a_backends_reading_half_assigns_nothing() -> None:
    # `_backend/reading.py` is what is read of a backend from outside its loop: an assignment
    # there would be a second writer of the loop's state.
    tree = ast.parse((PACKAGE / "_backend" / "reading.py").read_text())
    targets = [
        target
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
    ]
    assigned = [ast.unparse(t) for t in targets if isinstance(t, ast.Attribute | ast.Subscript)]
    assert assigned == []


def test_the_model_reads_no_file() -> None:
    # `_model/` is configs, records, views and pure decisions; the user's files are read by
    # `_sources.py` (a manifest, an entrypoint's source), the daemon's by `_daemon/`.
    reads = re.compile(
        r"\b(open|os\.(listdir|walk|scandir|stat|lstat|read))\(|\.read_(text|bytes)\("
    )
    found = [
        f"{path.name}:{n}"
        for path in sorted((PACKAGE / "_model").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if reads.search(line)
    ]
    assert found == []


def _assigned_attributes(path: Path) -> list[tuple[int, str, str]]:
    """Each assignment in `path` to an attribute of anything but `self`: (line, object, name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for one in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(one, ast.Attribute) and ast.unparse(one.value) != "self":
                    found.append((node.lineno, ast.unparse(one.value), one.attr))
    return found


def test_a_replica_is_written_by_its_set_and_its_checks_by_the_health_part() -> None:
    # `Replica`'s fields have one writer, `_backend/replica_set.py`; `Replica.checks` (the
    # health checks' bookkeeping) has one, `_backend/health.py`. Any other module of the
    # backend's that assigns to a replica is a second writer.
    from controller._backend.replica import Checks, Replica

    of_replica = {a.name.lstrip("_") for a in attrs.fields(Replica)} | {
        name for name, value in vars(Replica).items() if isinstance(value, property)
    }
    of_checks = {a.name for a in attrs.fields(Checks)}
    second = []
    for path in sorted((PACKAGE / "_backend").glob("*.py")):
        for line, owner, name in _assigned_attributes(path):
            if owner.endswith(".checks") and name in of_checks:
                if path.name != "health.py":
                    second.append(f"{path.name}:{line} {owner}.{name}")
            elif name in of_replica and path.name != "replica_set.py":
                second.append(f"{path.name}:{line} {owner}.{name}")
    assert second == []


def test_a_revision_book_is_written_by_its_histories_only() -> None:
    # A backend's revision history has one writer, the desk's `Histories`
    # (`_core/histories.py`): it installs the revisions a change writes and marks the outcomes
    # the backend's rollout reports. A mark or an assignment of a book's revisions anywhere else
    # is a second writer (as the rollout was, before).
    second = []
    owners = ("_core/histories.py", "_model/records/revisions.py")
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() in owners:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "mark"
                and "book" in ast.unparse(node.func.value).lower()
            ):
                second.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
        second += [
            f"{path.relative_to(PACKAGE)}:{line}"
            for line, _, name in _assigned_attributes(path)
            if name == "revisions"
        ]
    assert second == []


def test_the_state_dirs_files_are_named_in_statedir_only() -> None:
    # The daemon's state dir is one object, `StateDir` (`_daemon/statedir.py`): the daemon, its
    # ingress processes and the CLI ask it for a file, never join a name to a bare path.
    names = r"token|daemon\.json|lock|daemon\.log|controller\.db|w|ingress"
    joined = re.compile(rf'/ "({names})"|\{{slot\}}\.(json|log|sock)|\.listeners"')
    found = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for folder in ("_daemon", "_cli")
        for path in sorted((PACKAGE / folder).glob("*.py"))
        if path.name != "statedir.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if joined.search(line)
    ]
    assert found == []


def test_the_apis_app_holds_its_handlers_rather_than_being_them() -> None:
    # `Api` (the ASGI app: authentication, routing, errors made answers) and `Handlers` (what
    # each path does) are two parts, the one holding the other, not halves of one object.
    from controller._api.app import Api
    from controller._api.handlers import Handlers

    assert Api.__mro__ == (Api, object)
    assert Handlers.__mro__ == (Handlers, object)
    assert "__init__" in vars(Handlers)


def test_a_backend_holds_its_parts_rather_than_being_them() -> None:
    # `Backend` is a composition: its state (`LoopState`), the reducer that applies events to
    # it, the executor that acts, and `Reading`, each an object of its own, none a base class
    # stubbing what another half defines.
    from controller._backend.act import Executor
    from controller._backend.loop import Backend
    from controller._backend.loop_state import LoopState
    from controller._backend.reading import Reading
    from controller._backend.reduce import Reducer

    for part in (Backend, Executor, LoopState, Reading, Reducer):
        assert part.__mro__ == (part, object), part
    stubs = [
        path.name
        for path in sorted((PACKAGE / "_backend").glob("*.py"))
        if "NotImplementedError" in path.read_text()
    ]
    assert stubs == []


def test_a_backends_reducer_records_and_starts_no_task() -> None:
    # Reduce, decide, act: the reducer applies events to the backend's state and leaves what
    # they ask to be done (`Due`: stops, drains cut short) to the executor, which starts every
    # task. What it tells the launcher is bookkeeping: which tasks have ended.
    tree = ast.parse((PACKAGE / "_backend" / "reduce.py").read_text())
    told = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and ast.unparse(node.func.value) == "self._tasks"
    }
    assert told == {"ended", "gone"}


def test_a_cli_call_imports_no_trio_and_no_process_of_ours_imports_pytest() -> None:
    # The suite starts hundreds of CLI calls and daemons, and users script the CLI: a CLI call
    # that imported trio (through the route sources, for one helper) cost 0.25 s of CPU instead
    # of about 0.13 s; a daemon that imported trio.testing imported pytest with it (90 ms).
    probe = (
        "import sys, importlib\n"
        "importlib.import_module(sys.argv[1])\n"
        "print(' '.join(sorted({'trio', 'pytest'} & set(sys.modules))))\n"
    )

    def imported(module: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", probe, module],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return done.stdout.strip()

    assert imported("controller._cli.main") == ""
    assert imported("controller._daemon.main") == "trio"
    assert imported("controller._local.worker_process") == "trio"
