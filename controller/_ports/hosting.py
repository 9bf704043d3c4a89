"""What both replica hosts (the LocalRuntime worker, the Ray actor) share: the spec they are
given, how they build the user's class, and how they report its exceptions.

Kept free of heavy imports (no trio), because every replica process imports it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._model.spec import ReplicaSpec

#: Bounds on what one error reply carries: a message goes into one-line statuses, and a reply
#: must stay far below the wire's line limit, whatever the user's code raised.
MAX_MESSAGE = 2000
MAX_TRACEBACK = 32_000


def host_spec(spec: ReplicaSpec, pythonpath: Sequence[str]) -> dict[str, Any]:
    """What a replica host is told of the replica it hosts, as JSON data (never pickled)."""
    return {
        "tag": spec.tag,
        "backend": spec.backend,
        "version": spec.version,
        "entrypoint": spec.replica_config.entrypoint,
        "init_args": list(spec.replica_config.init_args),
        "init_kwargs": spec.replica_config.init_kwargs,
        "user_config": spec.user_config,
        "pythonpath": list(pythonpath),
    }


def add_to_path(pythonpath: Sequence[str]) -> None:
    """Put `pythonpath` in front of ``sys.path``, in its order (entries already there stay
    where they are)."""
    for entry in reversed(pythonpath):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def construct(spec: dict[str, Any]) -> Any:
    """Import the entrypoint and build the user's class (blocking: the caller runs it in a
    thread, so that the host keeps answering while a slow import or constructor runs)."""
    add_to_path(spec.get("pythonpath", []))
    module_name, _, attr_path = spec["entrypoint"].partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj(*spec.get("init_args", []), **spec.get("init_kwargs", {}))


def describe_error(exc: BaseException, traceback: str) -> dict[str, str]:
    """The user's exception as data: its type, its message and its traceback (the end of it,
    which names the failing line, if it is too long)."""
    message = str(exc)
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + "..."
    if len(traceback) > MAX_TRACEBACK:
        traceback = "...\n" + traceback[-MAX_TRACEBACK:]
    return {"error_type": type(exc).__name__, "message": message, "traceback": traceback}
