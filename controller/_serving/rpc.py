"""A method of a replica, called by a handle (``handle.call("predict", x)``): the request names
it (``x-controller-call``) and carries its arguments as JSON (``{"args": [...], "kwargs":
{...}}``); the answer is its result as JSON, or, for a generator, its items as lines of JSON as
they are yielded. What the method raises goes back as ``{"error": {"type", "message"}}`` (500,
or a last line of a stream), its traceback to the replica's log: the caller's handle raises it
as ``RemoteError``.

Only public methods of a class backend's instance are called, and none of the replica
contract's (``reconfigure``, ``check_health``, ``drain``, ``load``): those are the controller's
to call. The ingress drops a client's ``x-controller-call``: only handles (and whoever reaches a
replica's port, see docs/security.md) call methods."""

from __future__ import annotations

import contextlib
import inspect
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from .._http.answers import error_body
from .._ports.hosting import MAX_MESSAGE
from .calls import Caller
from .entry import CONTRACT
from .response import Answer

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_JSON = b"application/json"
_LINES = b"application/x-ndjson"


class NoSuchMethod(Exception):
    """The call names nothing a handle may call (404)."""


class BadCall(Exception):
    """The call's arguments are not ``{"args": [...], "kwargs": {...}}`` in JSON (400)."""


def method_of(instance: Any, name: str) -> Any:
    """The bound method `name` of `instance`, if a handle may call it: a function its class
    (or a Python base class of it) defines. Never an attribute of the instance (a callable
    stored on it), a builtin type's method (``dict.clear`` of a class that subclasses dict),
    nor a property, whose getter is not run to find out."""
    if instance is None:
        raise NoSuchMethod("this backend is no class: call it with handle.request")
    if not _NAME.fullmatch(name) or name in CONTRACT:
        raise NoSuchMethod(f"{name!r} is not a method a handle may call")
    for cls in type(instance).__mro__:
        if cls.__module__ == "builtins":
            break  # object, dict, list...: and what they inherit
        found = vars(cls).get(name)
        if found is None:
            continue
        if isinstance(found, (staticmethod, classmethod)):
            found = found.__func__
        if inspect.isfunction(found):
            return getattr(instance, name)
        break  # a property, a descriptor, a value: not a method
    raise NoSuchMethod(f"the replica has no method {name!r}")


def arguments(body: bytes) -> tuple[list[Any], dict[str, Any]]:
    try:
        given = json.loads(body) if body else {}
    except ValueError as exc:
        raise BadCall(f"the call's arguments are not JSON: {exc}") from None
    except RecursionError:
        raise BadCall("the call's arguments are nested too deeply") from None
    if isinstance(given, dict):
        args, kwargs = given.get("args", []), given.get("kwargs", {})
        if isinstance(args, list) and isinstance(kwargs, dict):
            return args, kwargs
    raise BadCall('the call\'s arguments must be {"args": [...], "kwargs": {...}}')


async def answer(
    caller: Caller,
    instance: Any,
    name: str,
    body: bytes,
    limit: int,
    failed: Callable[[BaseException], None],
) -> Answer:
    """The answer to a call of method `name` (errors of the call's own become its answer;
    what the method raises is the caller's to turn into `failure`). `failed` hears what a
    generator method raises once its items have begun."""
    try:
        method = method_of(instance, name)
        args, kwargs = arguments(body)
    except NoSuchMethod as exc:
        return Answer(404, [(b"content-type", _JSON)], error_body("NoSuchMethod", str(exc)))
    except BadCall as exc:
        return Answer(400, [(b"content-type", _JSON)], error_body("BadCall", str(exc)))
    result = await caller.method(method, args, kwargs, limit)
    if hasattr(result, "__anext__") or hasattr(result, "__next__"):
        return Answer(200, [(b"content-type", _LINES)], stream=_lines(caller, result, failed))
    return Answer(200, [(b"content-type", _JSON)], _json(result))


def failure(exc: BaseException) -> Answer:
    """What a call that raised answers its caller: the error's type and message."""
    return Answer(500, [(b"content-type", _JSON)], _error_line(exc).rstrip(b"\n"))


async def _lines(
    caller: Caller, items: Any, failed: Callable[[BaseException], None]
) -> AsyncIterator[bytes]:
    """A generator method's items as lines of JSON; what it raises, as a last line."""
    try:
        async with contextlib.aclosing(caller.items(items)) as each:
            async for item in each:
                yield _json(item) + b"\n"
    except Exception as exc:
        failed(exc)
        yield _error_line(exc)


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _error_line(exc: BaseException) -> bytes:
    message = str(exc)
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + "..."
    return error_body(type(exc).__name__, message) + b"\n"
