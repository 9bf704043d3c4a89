"""An ASGI application (FastAPI, Starlette, or any ``async def app(scope, receive, send)``) served
on a replica's connections: one ``http`` scope a request, its body handed over as it arrives,
its answer framed as `outgoing` frames any; and its ``lifespan``, started before the replica is
ready and shut down when it drains. It runs on the worker's trio loop: Starlette and FastAPI
run on anyio, which runs on trio."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, final
from urllib.parse import unquote

import trio

from .._http.framing import RequestHead
from .outgoing import Outgoing
from .response import check_header

logger = logging.getLogger("controller.worker")

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
BodyReader = Callable[[], Awaitable[bytes | None]]

_ASGI = {"version": "3.0", "spec_version": "2.4"}


class AppError(Exception):
    """The application broke the protocol (said so in the replica's log; a 500 if it can be)."""


@final
class Exchange:
    """One request to the application: its scope, ``receive`` and ``send``."""

    def __init__(
        self,
        head: RequestHead,
        outgoing: Outgoing,
        read: BodyReader | None,
        scope: dict[str, Any],
    ):
        self.head = head
        self.outgoing = outgoing
        self.read = read
        self.body_done = read is None
        self._given = False  # the request's last (or only) http.request message
        self.scope = scope
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._length: int | None = None
        self._started = False

    async def receive(self) -> Message:
        if not self.body_done:
            assert self.read is not None
            chunk = await self.read()
            if chunk is not None:
                return {"type": "http.request", "body": chunk, "more_body": True}
            self.body_done = True
        if not self._given:
            # A request without a body is one message too: its end.
            self._given = True
            return {"type": "http.request", "body": b"", "more_body": False}
        # The body is all given: what comes next is the client's hang-up, which cancels the
        # request (and so this wait) rather than arriving as a message.
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(self, message: Message) -> None:
        kind = message.get("type")
        outgoing = self.outgoing
        if kind == "http.response.start":
            if self._started:
                raise AppError("the application started its response twice")
            self._started = True
            status = message.get("status")
            if isinstance(status, bool) or not isinstance(status, int) or not 200 <= status <= 599:
                # (1xx: interim answers are not passed on from an application.)
                raise AppError(f"the application's response status is {status!r}")
            self._status = status
            headers: list[tuple[bytes, bytes]] = []
            for pair in message.get("headers", ()):
                name, value = bytes(pair[0]).lower(), bytes(pair[1])
                check_header(name, value)
                if name == b"content-length":
                    try:
                        self._length = int(value)
                    except ValueError:
                        raise AppError(f"the application's content-length is {value!r}") from None
                    continue
                if name in (b"transfer-encoding", b"connection"):
                    continue  # the framing is the server's
                headers.append((name, value))
            self._headers = headers
            return
        if kind == "http.response.body":
            if not self._started:
                raise AppError("the application sent a body before starting its response")
            body = bytes(message.get("body", b""))
            more = bool(message.get("more_body", False))
            if not outgoing.started:
                if not more and (self._length is None or self._length == len(body)):
                    await outgoing.whole(self._status, self._headers, body, keep=self.body_done)
                    return
                await outgoing.begin(
                    self._status,
                    self._headers,
                    keep=self.body_done,
                    length=self._length,
                    http_10=self.head.http_10,
                )
            await outgoing.part(body)
            if not more:
                await outgoing.end()
            return
        raise AppError(f"the application sent a message of type {kind!r} on an http scope")


def http_scope(
    head: RequestHead, peer: str, server: tuple[str, int], root_path: str, state: dict[str, Any]
) -> dict[str, Any]:
    """The ``http`` scope of `head` (the path with the route prefix in it, which Starlette's
    routing takes off, as Ray Serve's proxy hands it over)."""
    raw_path, _, query = head.target.partition(b"?")
    path = raw_path.decode("latin-1")
    if "%" in path:
        path = unquote(path, errors="surrogateescape")
    return {
        "type": "http",
        "asgi": _ASGI,
        "http_version": "1.0" if head.http_10 else "1.1",
        "method": head.method.decode("latin-1"),
        "scheme": "http",
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "root_path": root_path,
        "headers": head.headers,
        "client": (peer, 0),
        "server": server,
        "state": dict(state),
    }


@final
class Lifespan:
    """The application's ``lifespan`` scope: `startup` runs it in a task of `nursery` and waits
    for its startup; `shutdown` asks it to end and waits. An application that does not speak
    lifespan (it raises at once, as the spec allows) is served without it."""

    def __init__(self, app: Callable[..., Awaitable[None]], *, state: dict[str, Any] | None = None):
        self.app = app
        self.state: dict[str, Any] = {} if state is None else state
        """What its startup put in its scope's ``state`` (copied into each request's)."""
        self._to_app, self._app_reads = trio.open_memory_channel[Message](1)
        # Unbounded: what the application says never waits on us (we may have stopped
        # listening, after a failed startup).
        self._from_app, self._we_read = trio.open_memory_channel[Message](float("inf"))
        self._running = False

    async def startup(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._run)
        await self._to_app.send({"type": "lifespan.startup"})
        said = await self._we_read.receive()
        if said["type"] == "lifespan.startup.failed":
            raise RuntimeError(f"the application's startup failed: {said.get('message', '')}")
        self._running = said["type"] == "lifespan.startup.complete"

    async def shutdown(self) -> None:
        if not self._running:
            return
        self._running = False
        await self._to_app.send({"type": "lifespan.shutdown"})
        said = await self._we_read.receive()
        if said["type"] == "lifespan.shutdown.failed":
            logger.error("the application's shutdown failed: %s", said.get("message", ""))

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": _ASGI, "state": self.state}
        try:
            await self.app(scope, self._app_reads.receive, self._from_app.send)
        except Exception:
            if not self._running:
                # Before its startup completed: lifespan not spoken (a plain handler of http
                # scopes raises on others), and it is served without it.
                logger.info("the application does not speak ASGI lifespan; served without it")
                await self._from_app.send({"type": "lifespan.unsupported"})
                return
            logger.exception("the application's lifespan ended with an error")
        # It returned (or failed after its startup): whoever waits on it hears it has ended.
        await self._from_app.send({"type": "lifespan.shutdown.complete"})
