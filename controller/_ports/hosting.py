"""What both replica hosts (the LocalRuntime worker, the Ray actor) share: the spec they are
given, how they build the user's class, and how they report its exceptions.

Kept free of heavy imports (no trio), because every replica process imports it.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import traceback as tb
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._model.decisions.spec import ReplicaSpec

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
        "serving": {
            "max_ongoing_requests": spec.serving.max_ongoing_requests,
            "request_timeout_s": spec.serving.request_timeout_s,
        },
    }


def add_to_path(pythonpath: Sequence[str]) -> None:
    """Put `pythonpath` in front of ``sys.path``, in its order (entries already there stay
    where they are)."""
    for entry in reversed(pythonpath):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def load_entrypoint(spec: dict[str, Any]) -> Any:
    """Import the entrypoint's module and return what the entrypoint names (blocking: the
    caller runs it in a thread, so that the host keeps answering while a slow import runs)."""
    add_to_path(spec.get("pythonpath", []))
    module_name, _, attr_path = spec["entrypoint"].partition(":")
    with import_hints(spec):
        obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    return obj


def construct(spec: dict[str, Any]) -> Any:
    """Import the entrypoint and build the user's class (blocking, as `load_entrypoint`)."""
    cls = load_entrypoint(spec)
    with import_hints(spec):
        return cls(*spec.get("init_args", []), **spec.get("init_kwargs", {}))


@contextlib.contextmanager
def import_hints(spec: dict[str, Any]) -> Iterator[None]:
    """A module not found (importing the entrypoint, or in what the user's code does first)
    carries a note on where replicas import from, and how to change that."""
    try:
        yield
    except ModuleNotFoundError as exc:
        module_name = spec["entrypoint"].partition(":")[0]
        exc.add_note(_not_found_hint(exc.name, module_name, spec.get("pythonpath", [])))
        raise


def _not_found_hint(missing: str | None, module_name: str, pythonpath: Sequence[str]) -> str:
    where = ", ".join(pythonpath) if pythonpath else "none"
    fix = (
        "give its directory to the daemon with `controller run --pythonpath DIR` (a running "
        "daemon takes another --pythonpath only when restarted; its replicas keep running), "
        "or to the runtime's pythonpath=[...] when embedded"
    )
    if missing is not None and (module_name + ".").startswith(missing + "."):
        return (
            f"hint: the entrypoint's module {module_name!r} is not on the replicas' import "
            f"path (their --pythonpath: {where}): {fix}"
        )
    return (
        f"hint: the entrypoint's code imports {missing!r}, which is not on the replicas' "
        f"import path (their --pythonpath: {where}): a package goes in the Python the "
        f"replicas run ({sys.executable}); for code of your own, {fix}"
    )


#: The modules a replica's host runs its code under, whose frames come before the user's in
#: every traceback: the host itself, trio and its thread hand-off, the import machinery.
_HOST_MODULES = frozenset(
    {
        "trio",
        "outcome",
        "importlib",
        "_frozen_importlib",
        "_frozen_importlib_external",
        "threading",
        "concurrent",
        "asyncio",
        "ray",
    }
)


def tracebacks(exc: BaseException) -> tuple[str, str]:
    """`exc`'s traceback twice: whole, for the replica's log; and as the user reads it, from
    the user's own first frame (the host's frames before it, ten or so of the controller, trio
    and importlib, say nothing of their code), for status and the goal's error. With no frame
    of the user's (their module not found) the latter is the error and its notes alone."""
    whole = "".join(tb.format_exception(exc))
    shown = tb.TracebackException.from_exception(exc)
    hidden = _trim(shown, exc, set())
    text = "".join(shown.format())
    if hidden:
        frames = "1 frame" if hidden == 1 else f"{hidden} frames"
        text = (
            f"({frames} of the replica's host, before its code, left out: the replica's log "
            f"has the whole traceback)\n{text}"
        )
    return whole, text


def _trim(shown: tb.TracebackException, exc: BaseException, seen: set[int]) -> int:
    """Drop the host's leading frames from `shown` (made from `exc`), and from the exceptions
    it chains or groups; how many went from `shown` itself."""
    if id(exc) in seen:
        return 0
    seen.add(id(exc))
    hidden = 0
    frame = exc.__traceback__
    while frame is not None and _of_host(frame.tb_frame):
        hidden, frame = hidden + 1, frame.tb_next
    shown.stack = tb.StackSummary.from_list(list(shown.stack)[hidden:])
    pairs = [(shown.__cause__, exc.__cause__), (shown.__context__, exc.__context__)]
    if isinstance(exc, BaseExceptionGroup):
        pairs += zip(shown.exceptions or [], exc.exceptions, strict=False)
    for inner_shown, inner in pairs:
        if inner_shown is not None and inner is not None:
            _trim(inner_shown, inner, seen)
    return hidden


def _of_host(frame: FrameType) -> bool:
    name = str(frame.f_globals.get("__name__", ""))
    parts = name.split(".")
    if parts[0] == "controller":
        # All of the package but its test kit, whose replicas a user may deploy.
        return parts[1:2] != ["testing"]
    return parts[0] in _HOST_MODULES


#: The longest exception class name reported whole (Python's own are under 40 characters).
MAX_TYPE_NAME = 200


def describe_error(exc: BaseException, traceback: str) -> dict[str, str]:
    """The user's exception as data: its type, its message and its traceback (the end of it,
    which names the failing line, if it is too long)."""
    try:
        message = str(exc)
    except Exception:  # a user's __str__ that raises must not take the host down with it
        message = "<its str() failed>"
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + "..."
    if len(traceback) > MAX_TRACEBACK:
        traceback = "...\n" + traceback[-MAX_TRACEBACK:]
    kind = type(exc).__name__
    if len(kind) > MAX_TYPE_NAME:  # a class made with a name of megabytes
        kind = kind[:MAX_TYPE_NAME] + "..."
    return {"error_type": kind, "message": message, "traceback": traceback}
