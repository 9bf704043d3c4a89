"""Calls from code to a backend by name: a handle (``controller.worker.handle("embed")`` inside a
replica, ``ctl.handle("embed")`` beside an embedded controller).

A handle chooses the replica as the ingress does, from the same router (power of two choices,
``max_ongoing_requests``, the backend's queue up to ``max_queued_requests``, a canary's split,
replicas at its own host first), and speaks the ingress's HTTP/1.1 to it on pooled connections.
On the wire everything is HTTP and JSON, never pickle: ``request`` sends what it is given,
``call`` sends a method's arguments as a JSON object (``x-controller-call: NAME``), which the
replica's server answers with the method's JSON result.

A call is part of the request that makes it. It runs in the caller's task, so it is cancelled
with it (a deadline, a client's hang-up, a cancelled caller): its connection then closes, which
the callee's server sees as a hang-up and cancels its handler too, hop after hop, and every
place taken on the way is given back in a ``finally``. Its deadline is what the caller's request
has left (`current_deadline`, set by the replica's server around each handler), capped by the
callee's own ``request_timeout_s``; the callee hears it as ``x-request-timeout-ms``."""

from __future__ import annotations

import contextvars
import json as jsonlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, NoReturn, final

import attrs
import trio

from .._http.answers import ResponseHead, ResponseReader
from .._http.framing import Problem
from .._http.sockets import receive_upstream, send_all
from .._model.errors import ControllerError
from .router import Router
from .table import BackendRoutes, Rejected, Slot
from .upstream import Lost, NotSent, Pool, Stale, Upstream

#: The trio time by which the request a handler serves must be answered: set by a replica's
#: server around each handler; a handle's call inherits it (None: no request, no deadline).
current_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "controller_request_deadline", default=None
)

#: The method a call names; the callee's server answers it (``_serving.server``).
CALL_HEADER = b"x-controller-call"
#: Other replicas a request that never reached one is tried on.
MAX_TRIES = 3
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_METHOD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
#: Headers a handle sets itself.
_OURS = frozenset(
    {
        b"host",
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"x-request-timeout-ms",
        b"x-max-ongoing-requests",
        CALL_HEADER,
    }
)
_REPEATABLE = frozenset({b"GET", b"HEAD", b"OPTIONS"})


class HandleError(ControllerError):
    """A call through a handle that got no answer of the callee's code: ``kind`` says why
    (``NoReplicas``, ``Overloaded``, ``DeadlineExceeded``, ``Unreachable``, ``UnknownBackend``,
    ``NoRoutes``, ``Broken``, ``Status``)."""

    def __init__(self, backend: str, kind: str, message: str):
        super().__init__(f"backend {backend!r}: {message}")
        self.backend, self.kind = backend, kind


class RemoteError(HandleError):
    """The called method raised (its type and message, as the callee's server said them)."""

    def __init__(self, backend: str, kind: str, message: str, status: int):
        super().__init__(backend, kind, message)
        self.status = status


@final
@attrs.frozen
class HandleAnswer:
    """What a callee answered a ``request``."""

    status: int
    headers: Sequence[tuple[bytes, bytes]]
    """As sent (names in lower case)."""
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header `name`, in any case, or None."""
        key = name.lower().encode("latin-1")
        for found, value in self.headers:
            if found == key:
                return value.decode("latin-1")
        return None

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return jsonlib.loads(self.body)


@final
class Handle:
    """Calls backend `name`. Made by the process's handles (``controller.worker.handle``)."""

    def __init__(self, name: str, router: Router, pool: Pool, ready: Callable[[], Awaitable[None]]):
        self.name = name
        self._router = router
        self._pool = pool
        self._ready = ready

    def __repr__(self) -> str:
        return f"<Handle {self.name}>"

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        """``await handle.predict(x)`` is ``await handle.call("predict", x)``."""
        if method.startswith("_"):
            raise AttributeError(method)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self.call(method, *args, **kwargs)

        return call

    # -- calls --

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` of a replica of a class backend; its result. The
        arguments and the result are JSON. ``RemoteError`` if the method raised; another
        ``HandleError`` if no replica answered."""
        answer = await self.request(
            "POST", "/", body=_call_body(method, args, kwargs), headers={CALL_HEADER: method}
        )
        if answer.status == 200:
            return answer.json()
        _raise(self.name, answer.status, answer.body)

    @asynccontextmanager
    async def call_stream(
        self, method: str, *args: Any, **kwargs: Any
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """``async with handle.call_stream("generate", prompt) as items: async for item in
        items``: a generator method's items, as the callee yields them. Leaving the block early
        ends the call (the callee's generator is cancelled)."""
        body = _call_body(method, args, kwargs)
        async with self._opened("POST", "/", body, None, {CALL_HEADER: method}) as (head, piece):
            if head.status != 200:
                _raise(self.name, head.status, b"".join([p async for p in piece]))
            yield _Items(piece, self.name)

    async def request(
        self,
        method: str,
        path: str = "/",
        *,
        body: bytes | None = None,
        json: Any = None,
        headers: Mapping[str | bytes, str | bytes] | None = None,
    ) -> HandleAnswer:
        """An HTTP request to a replica of the backend (`path` as its code sees it, without
        the backend's route prefix); its whole answer, whatever its status."""
        async with self._opened(method, path, body, json, headers) as (head, pieces):
            parts = [piece async for piece in pieces]
        return HandleAnswer(head.status, tuple(head.headers), b"".join(parts))

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str = "/",
        *,
        body: bytes | None = None,
        json: Any = None,
        headers: Mapping[str | bytes, str | bytes] | None = None,
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """``async with handle.stream("GET", "/tokens") as pieces: async for piece in
        pieces``: an answer's body as it arrives (tokens, server-sent events). ``HandleError``
        unless its status is 2xx. Leaving the block early ends the request."""
        async with self._opened(method, path, body, json, headers) as (head, pieces):
            if not 200 <= head.status < 300:
                raise HandleError(self.name, "Status", f"answered {head.status}")
            yield pieces

    # -- the exchange --

    @asynccontextmanager
    async def _opened(
        self,
        method: str,
        path: str,
        body: bytes | None,
        json: Any,
        headers: Mapping[str | bytes, str | bytes] | None,
    ) -> AsyncIterator[tuple[ResponseHead, _Pieces]]:
        """One request, sent and answered as far as its head; its body's pieces follow. The
        replica's place is given back, and its connection pooled (or closed), on the way out,
        whatever happens."""
        if json is not None:
            body = jsonlib.dumps(json, separators=(",", ":")).encode()
            headers = {"content-type": "application/json", **(headers or {})}
        verb = method.upper().encode("ascii")
        if not _TOKEN.fullmatch(verb):
            raise ValueError(f"handle.request: method {method!r} is not an HTTP token")
        if not path.startswith("/") or any(c in path for c in "\r\n #"):
            raise ValueError(f"handle.request: path {path!r} must be an origin-form path")
        extra = _extra_headers(headers)
        call = any(key == CALL_HEADER for key, _ in extra)
        backend = await self._backend()
        deadline = _deadline(backend)
        repeatable = verb in _REPEATABLE and not body
        tried: frozenset[str] = frozenset()
        while True:
            slot = await self._acquire(backend, tried, deadline)
            upstream: Upstream | None = None
            answered = False
            try:
                with _until(deadline, self.name):
                    upstream = await self._pool.get(slot.address, check=not repeatable)
                    left_ms = max(1, int((deadline - trio.current_time()) * 1000))
                    await _send(upstream, verb, path, extra, body, left_ms, backend.max_ongoing)
                    reader = ResponseReader()
                    reader.head_only = verb == b"HEAD"
                    head = await _head(upstream, reader, repeatable, self.name)
                answered = True
            except Stale:
                self._pool.forget(slot.address)
                repeatable = False  # once more, on a new connection
            except NotSent as exc:
                backend.refused(slot)
                self._pool.forget(slot.address)
                tried = tried | {slot.tag}
                if len(tried) >= MAX_TRIES or len(tried) >= len(backend.slots):
                    raise HandleError(self.name, "Unreachable", str(exc)) from None
            finally:
                if not answered:  # tried again, or failed: its place and connection go now
                    backend.release(slot)
                    if upstream is not None:
                        self._pool.put(upstream)
            if answered:
                break
        assert upstream is not None
        pieces = _Pieces(upstream, reader, deadline, self.name)
        try:
            yield head, pieces
            # Reused only if the answer was read to its end and nothing was left over; after a
            # body, only for a call (which the replica's own server reads whole first).
            upstream.reusable = (
                head.keep_alive and pieces.done and not reader.extra and (not body or call)
            )
        finally:
            backend.release(slot)
            self._pool.put(upstream)

    async def _backend(self) -> BackendRoutes:
        await self._ready()
        backend = self._router.backends.get(self.name)
        if backend is None:
            if not self._router.connected:
                where = self._router.source.describe()
                message = f"{where} cannot be reached, and nothing is known of the backend yet"
                raise HandleError(self.name, "NoRoutes", message)
            raise HandleError(self.name, "UnknownBackend", "there is no such backend")
        return backend

    async def _acquire(
        self, backend: BackendRoutes, tried: frozenset[str], deadline: float
    ) -> Slot:
        slot = backend.try_acquire(tried)
        if slot is not None:
            return slot
        try:
            with _until(deadline, self.name):
                return await backend.wait(tried)
        except Rejected as exc:
            kind = {"queue_full": "Overloaded", "no_replicas": "NoReplicas"}.get(
                exc.cause, "Rejected"
            )
            raise HandleError(self.name, kind, str(exc)) from None


def _call_body(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    if not _METHOD_NAME.fullmatch(method):
        raise ValueError(f"handle.call: {method!r} is not a method a handle may call")
    try:
        return jsonlib.dumps({"args": args, "kwargs": kwargs}, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"handle.call({method!r}): the arguments must be JSON: {exc}") from None


def _raise(backend: str, status: int, body: bytes) -> NoReturn:
    """The callee's error, as its server said it (``{"error": {"type", "message"}}``)."""
    try:
        error = jsonlib.loads(body)["error"]
        kind, message = str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        kind, message = "Status", f"answered {status}: {body[:200]!r}"
    raise RemoteError(backend, kind, message, status)


def _extra_headers(
    headers: Mapping[str | bytes, str | bytes] | None,
) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    for name, value in (headers or {}).items():
        key = (name.encode("latin-1") if isinstance(name, str) else name).lower()
        raw = value.encode("latin-1") if isinstance(value, str) else value
        if not _TOKEN.fullmatch(key) or b"\r" in raw or b"\n" in raw or b"\x00" in raw:
            raise ValueError(f"handle: header {key!r}: {raw!r} cannot be sent")
        if key in _OURS and key != CALL_HEADER:
            continue  # the handle's to set
        out.append((key, raw))
    return out


def _deadline(backend: BackendRoutes) -> float:
    """What the caller's request has left, capped by the callee's own request_timeout_s."""
    own = trio.current_time() + backend.request_timeout_s
    inherited = current_deadline.get()
    return own if inherited is None else min(own, inherited)


@final
class _until:
    """``trio.fail_at(deadline)``, raised as the handle's own error."""

    def __init__(self, deadline: float, name: str):
        self._scope = trio.CancelScope(deadline=deadline)
        self._name = name

    def __enter__(self) -> None:
        self._scope.__enter__()

    def __exit__(self, *exc: Any) -> None:
        # The scope swallows only its own cancellation, which is raised here as the error.
        self._scope.__exit__(*exc)
        if self._scope.cancelled_caught:
            raise HandleError(self._name, "DeadlineExceeded", "no answer before the deadline")


async def _send(
    upstream: Upstream,
    verb: bytes,
    path: str,
    extra: list[tuple[bytes, bytes]],
    body: bytes | None,
    left_ms: int,
    max_ongoing: int,
) -> None:
    out = [verb, b" ", path.encode("latin-1"), b" HTTP/1.1\r\nhost: replica\r\n"]
    for key, value in extra:
        out += (key, b": ", value, b"\r\n")
    out.append(
        b"content-length: %d\r\nx-request-timeout-ms: %d\r\nx-max-ongoing-requests: %d\r\n\r\n"
        % (len(body or b""), left_ms, max_ongoing)
    )
    if body:
        out.append(body)
        upstream.body_sent = True
    try:
        await send_all(upstream.sock, b"".join(out))
    except OSError as exc:
        raise NotSent(f"connection to {upstream.address} lost: {exc}") from None


async def _head(
    upstream: Upstream, reader: ResponseReader, repeatable: bool, name: str
) -> ResponseHead:
    events = reader.events
    while True:
        data = await receive_upstream(upstream.sock)
        if not data:
            if repeatable and upstream.reused and not reader.began:
                raise Stale
            if repeatable and not reader.began:
                raise Lost(f"the replica at {upstream.address} closed without answering")
            raise HandleError(name, "Broken", f"the replica at {upstream.address} closed early")
        try:
            reader.feed(data)
        except Problem as problem:
            raise HandleError(name, "Broken", str(problem)) from None
        if events:
            first = events.popleft()
            assert isinstance(first, ResponseHead)
            return first


@final
class _Pieces:
    """An answer's body as it arrives (an async iterator of bytes); each wait under the
    request's deadline."""

    def __init__(self, upstream: Upstream, reader: ResponseReader, deadline: float, name: str):
        self._upstream = upstream
        self._reader = reader
        self._deadline = deadline
        self._name = name
        self.done = False

    def __aiter__(self) -> _Pieces:
        return self

    async def __anext__(self) -> bytes:
        events, reader = self._reader.events, self._reader
        while not self.done:
            while events:
                event = events.popleft()
                if isinstance(event, bytes):
                    return event
                self.done = True  # the end
                raise StopAsyncIteration
            with _until(self._deadline, self._name):
                data = await receive_upstream(self._upstream.sock)
            if not data:
                if reader.closed():
                    continue
                where = self._upstream.address
                raise HandleError(self._name, "Broken", f"the replica at {where} cut its answer")
            try:
                reader.feed(data)
            except Problem as problem:
                raise HandleError(self._name, "Broken", str(problem)) from None
        raise StopAsyncIteration


@final
class _Items:
    """A streamed call's items: lines of JSON, as they arrive."""

    def __init__(self, pieces: _Pieces, name: str):
        self._pieces = pieces
        self._name = name
        self._lines: list[bytes] = []
        self._pending = b""

    def __aiter__(self) -> _Items:
        return self

    async def __anext__(self) -> Any:
        while not self._lines:
            try:
                chunk = await self._pieces.__anext__()
            except StopAsyncIteration:
                if self._pending.strip():
                    self._lines, self._pending = [self._pending], b""
                    break
                raise
            *lines, self._pending = (self._pending + chunk).split(b"\n")
            self._lines = [line for line in lines if line.strip()]
        item = jsonlib.loads(self._lines.pop(0))
        if isinstance(item, dict) and set(item) == {"error"}:
            _raise(self._name, 500, jsonlib.dumps(item).encode())
        return item
