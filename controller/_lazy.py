"""Package namespaces whose names are imported on first use (PEP 562).

The package ``controller`` and its subpackages export names this way so that a process importing
one corner (a replica worker, a Ray actor, the CLI) does not pay for the rest, and so that
``controller.aio`` does not import trio_asyncio unless that way of embedding is used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, home: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for `package`, whose public names live in the modules
    `home` maps them to (relative names, like ``"._config"``)."""

    def getattr_(name: str) -> Any:
        where = home.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where, package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *home})

    return getattr_, dir_
