"""Connections to replicas: HTTP/1.1 through h11, kept open and reused per replica address."""

from __future__ import annotations

import collections
import errno
import select
import socket
from typing import final

import attrs
import h11
import trio

#: Idle connections kept per replica; more are closed when their request ends.
MAX_IDLE_PER_REPLICA = 64
_READ_SIZE = 65536


class NotSent(Exception):
    """The request could not be sent, and none of it reached the replica: safe to retry on
    another one (a refused connection, or one reset before the request went out)."""


@final
@attrs.define(eq=False)
class Upstream:
    """One connection to a replica, speaking h11 as the client."""

    address: str
    stream: trio.SocketStream
    conn: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.CLIENT))

    async def send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            await self.stream.send_all(data)

    async def next_event(self) -> h11.Event:
        """The next h11 event from the replica (``h11.ConnectionClosed`` if it hung up)."""
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                assert not isinstance(event, type)  # PAUSED is not possible for a client here
                return event
            data = await self.stream.receive_some(_READ_SIZE)
            self.conn.receive_data(data)

    body_sent: bool = False
    """A request body went out on it: the replica may have answered without reading it all
    (an early 401 or 413), and what it left unread would be read as the next request."""

    @property
    def reusable(self) -> bool:
        """Whether the next request may go on this connection: both sides done, nothing sent
        that the replica may not have read, and nothing received past the answer (stray bytes
        would be read as the next answer)."""
        conn = self.conn
        return (
            conn.our_state is h11.DONE
            and conn.their_state is h11.DONE
            and not self.body_sent
            and not conn.trailing_data[0]
        )

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


def _dropped(stream: trio.SocketStream) -> bool:
    """Whether an idle connection was closed (or sent something) by the replica meanwhile:
    one poll that does not wait, so a request is never sent on a connection known to be dead.
    Readable means EOF, a reset or stray bytes: none is a clean idle connection."""
    poller = select.poll()
    poller.register(stream.socket.fileno(), select.POLLIN)
    return bool(poller.poll(0))


@final
@attrs.define(eq=False)
class Pool:
    """Idle connections per replica address, newest last (reused first: warm in the cache)."""

    connect_timeout_s: float = 5.0
    _idle: dict[str, collections.deque[Upstream]] = attrs.field(factory=dict)
    opened: int = 0
    """Connections opened in all (a reused one adds nothing): for tests and the benchmark."""

    async def get(self, address: str) -> Upstream:
        idle = self._idle.get(address)
        while idle:
            upstream = idle.pop()
            if not _dropped(upstream.stream):
                return upstream
            await upstream.aclose()
        host, _, port = address.rpartition(":")
        try:
            with trio.fail_after(self.connect_timeout_s):
                stream = await trio.open_tcp_stream(host, int(port))
        except (OSError, trio.TooSlowError, ValueError) as exc:
            raise NotSent(f"cannot connect to {address}: {_why(exc)}") from None
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.opened += 1
        return Upstream(address, stream)

    async def put(self, upstream: Upstream) -> None:
        """Keep `upstream` for the next request to its replica, if it can take one."""
        if not upstream.reusable:
            await upstream.aclose()
            return
        upstream.conn.start_next_cycle()
        idle = self._idle.setdefault(upstream.address, collections.deque())
        if len(idle) >= MAX_IDLE_PER_REPLICA:
            await upstream.aclose()
            return
        idle.append(upstream)

    async def forget(self, address: str) -> None:
        """Close the idle connections to a replica that left."""
        for upstream in self._idle.pop(address, ()):
            await upstream.aclose()

    async def aclose(self) -> None:
        for address in list(self._idle):
            await self.forget(address)


def _why(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "no answer to the connection"
    if isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED:
        return "connection refused"
    return str(exc) or type(exc).__name__
