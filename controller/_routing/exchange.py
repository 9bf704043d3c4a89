"""One exchange of a handle with a replica, on one connection: the request written (a call's
arguments as JSON, the caller's headers checked), the answer's head read, its body's pieces and
a streamed call's items as they arrive, each wait under the call's deadline; and the errors a
caller sees (``HandleError``, ``RemoteError``)."""

from __future__ import annotations

import json as jsonlib
import re
from collections.abc import Mapping
from typing import Any, NoReturn, final

import trio

from .._http.answers import ResponseHead, ResponseReader
from .._http.framing import Problem
from .._http.sockets import receive_upstream, send_all
from .._model.values.errors import ControllerError
from .upstream import Lost, NotSent, Stale, Upstream

#: The method a call names; the callee's server answers it (``_serving.server``).
CALL_HEADER = b"x-controller-call"
HTTP_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
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
        b"x-controller-side",  # the split's, as the caller's request went (``split.SIDE_HEADER``)
        CALL_HEADER,
    }
)

#: The resolution of ``x-request-timeout-ms``, in which a callee hears the time a call has left.
_HEADER_RESOLUTION_S = 0.001


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


def call_body(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    if not _METHOD_NAME.fullmatch(method):
        raise ValueError(f"handle.call: {method!r} is not a method a handle may call")
    try:
        return jsonlib.dumps({"args": args, "kwargs": kwargs}, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"handle.call({method!r}): the arguments must be JSON: {exc}") from None
    except RecursionError:
        raise TypeError(f"handle.call({method!r}): the arguments are nested too deeply") from None


def raise_remote(backend: str, status: int, body: bytes) -> NoReturn:
    """The callee's error, as its server said it (``{"error": {"type", "message"}}``). Its
    server's own 504 (the call's deadline passed there first) is the call's
    ``DeadlineExceeded``, as when it passes here first: the method raised nothing."""
    try:
        error = jsonlib.loads(body)["error"]
        kind, message = str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError, RecursionError):
        kind, message = "Status", f"answered {status}: {body[:200]!r}"
    if status == 504 and kind == "GatewayTimeout":
        raise HandleError(backend, "DeadlineExceeded", f"no answer before the deadline: {message}")
    raise RemoteError(backend, kind, message, status)


def extra_headers(
    headers: Mapping[str | bytes, str | bytes] | None,
) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    for name, value in (headers or {}).items():
        key = (name.encode("latin-1") if isinstance(name, str) else name).lower()
        raw = value.encode("latin-1") if isinstance(value, str) else value
        if not HTTP_TOKEN.fullmatch(key) or b"\r" in raw or b"\n" in raw or b"\x00" in raw:
            raise ValueError(f"handle: header {key!r}: {raw!r} cannot be sent")
        if key in _OURS and key != CALL_HEADER:
            continue  # the handle's to set
        out.append((key, raw))
    return out


@final
class until:
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


async def send_request(
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


async def answer_head(
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
class Pieces:
    """An answer's body as it arrives (an async iterator of bytes); each wait under the
    request's deadline."""

    def __init__(
        self,
        upstream: Upstream,
        reader: ResponseReader,
        give_up: float,
        name: str,
        deadline: float | None = None,
    ):
        self._upstream = upstream
        self._reader = reader
        self._give_up = give_up
        self._deadline = give_up if deadline is None else deadline
        """The call's deadline: an answer cut past it was cut by the callee at it."""
        self._name = name
        self.done = False

    def __aiter__(self) -> Pieces:
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
            with until(self._give_up, self._name):
                data = await receive_upstream(self._upstream.sock)
            if not data:
                if reader.closed():
                    continue
                where = self._upstream.address
                # The callee heard our time left in whole milliseconds, rounded down: its
                # deadline may come up to one before ours (seen at load 10 as "Broken").
                if trio.current_time() >= self._deadline - _HEADER_RESOLUTION_S:
                    message = f"the replica at {where} cut its answer at the deadline"
                    raise HandleError(self._name, "DeadlineExceeded", message)
                raise HandleError(self._name, "Broken", f"the replica at {where} cut its answer")
            try:
                reader.feed(data)
            except Problem as problem:
                raise HandleError(self._name, "Broken", str(problem)) from None
        raise StopAsyncIteration


@final
class Items:
    """A streamed call's items: lines of JSON, as they arrive."""

    def __init__(self, pieces: Pieces, name: str):
        self._pieces = pieces
        self._name = name
        self._lines: list[bytes] = []
        self._pending = b""

    def __aiter__(self) -> Items:
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
            raise_remote(self._name, 500, jsonlib.dumps(item).encode())
        return item
