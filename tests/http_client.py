"""A small HTTP/1.1 client on trio and h11, for driving the ingress from tests: one request per
connection by default, or several on a kept connection (``Conn``); and traffic, requests sent by
a few tasks at once (``Traffic``)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, final

import attrs
import h11
import trio

#: A traffic loop's pause between a request's answer and its next request, where what a test
#: waits for is a time (a takeover, a canary's pause, a restart) and not a count of answers:
#: with none, its few tasks send as fast as two cores answer (hundreds a second), and take the
#: CPU from the daemons under test, and from the other tests beside it, for answers nobody
#: needs. With it, each task still sends tens a second.
THINK_S = 0.01


@attrs.frozen
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@final
@attrs.define(eq=False)
class Conn:
    stream: trio.SocketStream
    conn: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.CLIENT))

    @classmethod
    async def open(cls, port: int, host: str = "127.0.0.1") -> Conn:
        return cls(await trio.open_tcp_stream(host, port))

    async def request(
        self,
        path: str,
        *,
        method: str = "GET",
        body: bytes | AsyncIterator[bytes] | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> Answer:
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        all_headers = [("Host", "test"), *(headers or [])]
        if isinstance(body, bytes):
            all_headers.append(("Content-Length", str(len(body))))
        elif body is not None:
            all_headers.append(("Transfer-Encoding", "chunked"))
        await self._send(h11.Request(method=method, target=path, headers=all_headers))
        if isinstance(body, bytes):
            await self._send(h11.Data(data=body))
        elif body is not None:
            async for chunk in body:
                await self._send(h11.Data(data=chunk))
        await self._send(h11.EndOfMessage())
        status, got, data = 0, {}, bytearray()
        while True:
            event = await self._next()
            if isinstance(event, h11.Response):
                status = event.status_code
                got = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                data += event.data
            elif isinstance(event, h11.EndOfMessage):
                return Answer(status, got, bytes(data))
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError(f"closed mid-answer after {len(data)} bytes")

    async def _send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            try:
                await self.stream.send_all(data)
            except trio.BrokenResourceError as exc:
                raise ConnectionError(f"the server closed the connection: {exc}") from None

    async def _next(self) -> h11.Event:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise ConnectionError(str(exc)) from None
            if event is h11.NEED_DATA:
                try:
                    self.conn.receive_data(await self.stream.receive_some(65536))
                except trio.BrokenResourceError as exc:
                    raise ConnectionError(f"the server reset the connection: {exc}") from None
                continue
            assert not isinstance(event, type)
            return event

    async def aclose(self) -> None:
        await self.stream.aclose()


async def request(port: int, path: str, *, host: str = "127.0.0.1", **kwargs: Any) -> Answer:
    """One request on a connection of its own."""
    conn = await Conn.open(port, host)
    try:
        return await conn.request(path, **kwargs)
    finally:
        await conn.aclose()


async def connect_from(source: str, port: int) -> trio.SocketStream:
    """A connection to 127.0.0.1:`port` from the loopback address `source` (another client, as
    the server sees it: its own per-address share)."""
    sock = trio.socket.socket()
    try:
        await sock.bind((source, 0))
        await sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


async def get_from(source: str, port: int, path: str, headers: str = "") -> bytes:
    """A GET of `path` from `source` on a connection of its own (closed after the answer):
    the whole answer. `headers`: more header lines, each ending with CRLF."""
    async with await connect_from(source, port) as stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n".encode()
        )
        answer = bytearray()
        while chunk := await stream.receive_some(65536):
            answer += chunk
    return bytes(answer)


async def raw(port: int, data: bytes, *, read: bool = True) -> bytes:
    """Send raw bytes, reading meanwhile (a server may answer, and close, before it has read
    them all); everything the server answers until it closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    out = bytearray()
    async with stream, trio.open_nursery() as nursery:

        async def send() -> None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(data)

        nursery.start_soon(send)
        while read:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            out += chunk
        if not read:
            return b""  # the sender finishes, then the connection closes
        nursery.cancel_scope.cancel()
    return bytes(out)


@attrs.define
class Traffic:
    """Requests sent through the ingress one after another by a few tasks, each answer kept."""

    port: int
    answers: list[tuple[int, str]] = attrs.field(factory=list)
    stop: trio.Event = attrs.field(factory=trio.Event)
    _grew: trio.Event = attrs.field(factory=trio.Event)

    async def send(self) -> None:
        while not self.stop.is_set():
            answer = await request(self.port, "/app/any")
            ok = answer.status == 200
            self.answers.append(
                (answer.status, answer.json()["replica"] if ok else answer.body.decode()[:300])
            )
            self._grew.set()
            self._grew = trio.Event()
            await trio.sleep(THINK_S)

    async def answered(self, count: int) -> None:
        """Wait until `count` requests in all have been answered."""
        while len(self.answers) < count:
            await self._grew.wait()
