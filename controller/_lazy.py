"""Package namespaces whose names are imported on first use (PEP 562).

The package ``controller`` and its public subpackages export names this way so that a process
importing one corner (a replica worker, a Ray actor, the CLI) does not pay for the rest, and so
that ``controller.aio`` does not import trio_asyncio unless that way of embedding is used.

Each package lists its public names once, as a type checker reads them: ``from .m import N as
N`` under ``if TYPE_CHECKING:`` in its ``__init__``. The same lines tell this module, on the
first lookup of a name, where each name lives (like scientific-python's ``lazy_loader`` reads a
stub), so no second list can drift from the first.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def exports_of(init_file: str) -> dict[str, str]:
    """The names a package's ``__init__`` (at `init_file`) re-exports under ``if
    TYPE_CHECKING:``, each with its module, relative to the package (``"._config"``)."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"), init_file)
    found: dict[str, str] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for line in node.body:
            if isinstance(line, ast.ImportFrom) and line.level:
                for alias in line.names:
                    if alias.asname == alias.name:  # PEP 484's explicit re-export
                        found[alias.name] = "." * line.level + (line.module or "")
    return found


def lazy_exports(
    package: str, init_file: str
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for `package`, whose public names are those its
    ``__init__`` re-exports under ``if TYPE_CHECKING:``. ``__all__`` is one of the names it
    answers, computed on first use too."""
    home: dict[str, str] | None = None

    def exports() -> dict[str, str]:
        nonlocal home
        if home is None:
            home = exports_of(init_file)
        return home

    def getattr_(name: str) -> Any:
        if name == "__all__":
            value: Any = sorted(exports())
        else:
            where = exports().get(name)
            if where is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            value = getattr(importlib.import_module(where, package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports()})

    return getattr_, dir_
