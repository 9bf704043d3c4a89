"""What a backend's entrypoint names, and how its replica is built from it (the table of
docs/backends-as-code.md says the same):

- a function of the request (or of nothing), ``def hello(request)`` or ``async def
  f(request)``: the worker serves HTTP on the replica's port and calls it for each request;
- a class whose instances are callable so (``async def __call__(self, request)``): built once
  per replica with ``init_args`` and ``init_kwargs``, then called for each request; its
  ``reconfigure``, ``check_health``, ``drain`` and ``load`` are called as any replica's;
- an ASGI application (``app = FastAPI()``, ``async def app(scope, receive, send)``, or a class
  whose instances are one): the worker serves it, its lifespan too, on the worker's trio loop;
- a class without ``__call__`` whose methods other backends call (``handle.call``, Ray Serve's
  deployment of methods): built once; the worker serves calls of its public methods (plain HTTP
  requests get 404);
- a class without ``__call__`` and without such methods, or that says ``serves_itself = True``:
  a replica that serves its own port, as before: built once, and left to serve.

Told apart by the call's parameters: three (``scope, receive, send``) is ASGI, none or one is a
handler of requests. Blocking (the import and the constructor run here): the caller runs
`build` in a thread."""

from __future__ import annotations

import inspect
from typing import Any, Literal, final

import attrs

from .._ports.hosting import import_hints, load_entrypoint
from .response import Response

Kind = Literal["function", "callable", "asgi", "methods", "replica"]
#: What the controller calls of a replica: never a handle's to call.
CONTRACT = frozenset({"reconfigure", "check_health", "drain", "load"})


class EntrypointError(TypeError):
    """The entrypoint names nothing that can be served, or is given what it cannot take."""


@final
@attrs.frozen
class Entry:
    """A replica built from its entrypoint."""

    kind: Kind
    target: Any
    """What each request calls (a function, the callable instance, the ASGI app); None for a
    replica that serves itself."""
    instance: Any
    """What the controller calls ``reconfigure``, ``check_health``, ``drain`` and ``load`` of:
    the instance of a class; None for a function or a module's ASGI app."""

    @property
    def served(self) -> bool:
        """The worker serves its HTTP (any kind but a class that serves its own port)."""
        return self.kind != "replica"


def build(spec: dict[str, Any]) -> Entry:
    """Import the entrypoint of `spec` and build its replica."""
    obj = load_entrypoint(spec)
    args, kwargs = spec.get("init_args", []), spec.get("init_kwargs", {})
    name = spec["entrypoint"]
    if inspect.isclass(obj):
        with import_hints(spec):
            instance = obj(*args, **kwargs)
        if not _defines_call(obj):
            if getattr(obj, "serves_itself", False) or not _has_methods(obj):
                return Entry("replica", None, instance)
            return Entry("methods", _methods_only, instance)
        return Entry(_kind_of(type(instance).__call__, name, bound=False), instance, instance)
    if not callable(obj):
        raise EntrypointError(
            f"entrypoint {name!r} names an object of type {type(obj).__name__}, which cannot be "
            "called: name a function, a class or an ASGI application"
        )
    if args or kwargs:
        raise EntrypointError(
            f"entrypoint {name!r} names a function or an application, not a class: init_args "
            "and init_kwargs are for a class (leave them out)"
        )
    function = obj if inspect.isroutine(obj) else type(obj).__call__
    kind = _kind_of(function, name, bound=inspect.isroutine(obj))
    return Entry("function" if kind == "callable" else kind, obj, None)


def _defines_call(cls: type) -> bool:
    return any("__call__" in vars(k) for k in cls.__mro__ if k is not object)


def _has_methods(cls: type) -> bool:
    """Whether `cls` has a public method a handle may call."""
    return any(
        not name.startswith("_") and name not in CONTRACT and callable(getattr(cls, name, None))
        for name in dir(cls)
    )


def _methods_only(request: Any) -> Response:
    """A plain HTTP request to a class of methods."""
    return Response(
        {
            "error": {
                "type": "NoRoute",
                "message": "this backend answers calls of its methods "
                "(a handle's call), not HTTP requests",
            }
        },
        status_code=404,
    )


def _kind_of(function: Any, name: str, *, bound: bool) -> Kind:
    """ASGI (three parameters it needs, async) or a handler of requests (at most one: the
    request; parameters with a default are left to theirs)."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return "callable"  # a builtin without a signature: called with the request
    if not bound and params:
        params = params[1:]  # an unbound __call__'s self
    needed = [
        p
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    keyword_only = [
        p.name
        for p in params
        if p.kind == inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    ]
    if keyword_only:
        raise EntrypointError(
            f"entrypoint {name!r} needs keyword-only arguments ({', '.join(keyword_only)}): a "
            "handler takes the request as its first positional argument"
        )
    if len(needed) == 3:
        if not _is_async(function):
            raise EntrypointError(
                f"entrypoint {name!r} takes (scope, receive, send) but is not async: an ASGI "
                "application is `async def app(scope, receive, send)`"
            )
        return "asgi"
    if len(needed) <= 1:
        return "callable"
    raise EntrypointError(
        f"entrypoint {name!r} needs {len(needed)} arguments: a handler takes the request (or "
        "nothing), an ASGI application takes (scope, receive, send)"
    )


def _is_async(function: Any) -> bool:
    # An instance whose class's __call__ is async (a middleware object) counts as async.
    call = vars(type(function)).get("__call__")
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)
