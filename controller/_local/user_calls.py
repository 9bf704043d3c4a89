"""Calls from a worker into the user's code: sync code in a thread, async code as it is, and
what the user raised described as the runtime reports it."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import trio

from .._ports.hosting import describe_error, tracebacks


def describe(exc: BaseException) -> dict[str, str]:
    """The user's exception as the runtime reports it: type, message and its traceback from
    the user's first frame; the whole traceback goes to the worker's log."""
    if isinstance(exc, _Escaped) and exc.__cause__ is not None:
        exc = exc.__cause__  # the user's own SystemExit, as they raised it
    whole, shown = tracebacks(exc)
    sys.stderr.write(whole)
    return describe_error(exc, shown)


class _Escaped(Exception):
    """The user's SystemExit, KeyboardInterrupt or GeneratorExit (its cause), as an error of
    the call that raised it: a health check that calls ``sys.exit`` fails, and says so, instead
    of ending the worker."""


async def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a user method, sync or async. Sync code runs in a thread so the worker stays
    responsive (pings, drains) while it works."""
    try:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        # Boxed: trio refuses a thread's result that is a coroutine, naming our lambda, not the
        # user's method; one returned by a plain method is awaited here, as an async one is.
        (result,) = await trio.to_thread.run_sync(lambda: (fn(*args),))
        if inspect.isawaitable(result):
            return await result
        return result
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
        raise _Escaped(type(exc).__name__) from exc


def has(instance: Any, name: str) -> bool:
    """Whether the replica has a method `name` (True if looking raises: calling it then
    reports the user's error)."""
    try:
        return getattr(instance, name, None) is not None
    except Exception:
        return True
