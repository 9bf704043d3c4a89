"""A server of ours: takes client connections from its listeners and serves each in a task of
its own (``connection``), with its handler (the ingress's proxy, a replica's server). It owns
what its connections share: who is admitted (``admission``), their deadlines (``timers``) and
the watch for clients that hang up (``hangups``)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, final

import trio

from .admission import Admission
from .connection import Connection, Handler
from .hangups import Hangups
from .limits import ConnectionLimits
from .ratelimit import RateLimitedLog
from .sockets import close
from .timers import Timers

#: Connections taken from a listener's queue in one go before other tasks run.
_ACCEPT_BATCH = 64


@final
class Server:
    """Serves `handler` on listeners: ``serve`` until cancelled, or `close` to end."""

    def __init__(
        self,
        limits: ConnectionLimits,
        handler: Handler,
        logger: logging.Logger,
        name: str,
        on_refused: Callable[[str], None] = lambda reason: None,
    ):
        self.limits = limits
        self.handler = handler
        self.admission = Admission(limits.max_connections, limits.max_connections_per_client)
        self._on_refused = on_refused
        """Told why a connection was closed unserved (``per_client``, ``limit``, ``evicted``)."""
        self._warnings = RateLimitedLog(logger)
        self._name = name
        """What the server's log lines begin with (``ingress``, ``replica``)."""
        self._accepting: list[trio.CancelScope] = []

    async def serve(
        self,
        listeners: Sequence[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve client connections on `listeners` until cancelled, or, after `close`, until
        the connections open then have ended."""
        hangups, timers = Hangups(), Timers()
        accepting = trio.CancelScope()
        self._accepting.append(accepting)
        try:
            # The hang-up watch and the deadlines outlive the connections they serve.
            async with trio.open_nursery() as services:
                services.start_soon(hangups.run)
                services.start_soon(timers.run)
                async with trio.open_nursery() as connections:
                    with accepting:
                        async with trio.open_nursery() as accepts:
                            for listener in listeners:
                                accepts.start_soon(
                                    self._accept, listener, connections, hangups, timers
                                )
                            task_status.started()
                services.cancel_scope.cancel()
        finally:
            self._accepting.remove(accepting)
            hangups.close()

    def close(self) -> None:
        """Stop taking connections: the listeners close, idle kept-alive connections close at
        once, new ones once they have had their first request answered (or `CLOSING_GRACE_S`
        passed without one), and the others after the request under way; ``serve`` then
        returns (bound the wait with a deadline of your own)."""
        self.admission.closing = True
        for scope in self._accepting:
            scope.cancel()
        for conn in self.admission.idle_connections():
            if isinstance(conn, Connection):
                conn.closing_now()

    @property
    def closing(self) -> bool:
        return self.admission.closing

    async def _accept(
        self,
        listener: trio.SocketListener,
        nursery: trio.Nursery,
        hangups: Hangups,
        timers: Timers,
    ) -> None:
        # Accepted on a socket of our own over the listener's descriptor (a duplicate, closed
        # here): plain non-blocking calls, as the connections use (see sockets).
        with listener.socket, _own_socket(listener.socket) as sock:
            try:
                while True:
                    await trio.lowlevel.wait_readable(sock)
                    for _ in range(_ACCEPT_BATCH):
                        try:
                            conn, address = sock.accept()
                        except BlockingIOError:
                            break
                        except OSError as exc:
                            # Out of descriptors, say: give those open a moment to finish.
                            self._warnings.warn(
                                "accept", "%s: accept failed (%s); pausing 0.1 s", self._name, exc
                            )
                            await trio.sleep(0.1)
                            break
                        self._admit(conn, address, nursery, hangups, timers)
            finally:
                if self.admission.closing:
                    # Closing a listener resets what waits in its queue, though its siblings
                    # on the port (SO_REUSEPORT) would have taken it: take it all now, and
                    # close at once after, so that only what arrives in between is lost.
                    while True:
                        try:
                            conn, address = sock.accept()
                        except OSError:
                            break
                        self._admit(conn, address, nursery, hangups, timers)

    def _admit(
        self,
        sock: socket.socket,
        address: Any,
        nursery: trio.Nursery,
        hangups: Hangups,
        timers: Timers,
    ) -> None:
        peer = str(address[0]) if isinstance(address, tuple) else "-"
        verdict = self.admission.admit(peer)
        if verdict.refused is not None:
            # Closed unanswered: an answer would be lost anyway in the reset that closing a
            # socket with unread bytes sends.
            sock.close()
            self._on_refused(verdict.refused)
            self._warnings.warn(
                f"refused-{verdict.refused}",
                "%s: connection from %s refused (%s)",
                self._name,
                peer,
                "it has max_connections_per_client open"
                if verdict.refused == "per_client"
                else "max_connections open, none idle",
            )
            return
        if isinstance(verdict.evict, Connection):
            self._on_refused("evicted")
            verdict.evict.evict()
        sock.setblocking(False)
        with contextlib.suppress(OSError):  # not TCP (a Unix socket): nothing to set
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Connection(sock, peer, self.limits, self.handler, self.admission, timers, hangups)
        nursery.start_soon(self._serve_one, conn)

    async def _serve_one(self, conn: Connection) -> None:
        try:
            await conn.serve()
        except Exception:
            # A bug must not take the server down: the connection is closed (what its request
            # held is given back by the handler's own finally), and the fault logged.
            self._warnings.warn(
                "connection-error",
                "%s: connection from %s failed",
                self._name,
                conn.peer,
                exc_info=True,
            )


async def open_listener(host: str, port: int, *, reuse_port: bool = False) -> trio.SocketListener:
    """A listening socket on `host`:`port` (port 0: any free one). With `reuse_port`, several
    processes may listen on one port (``SO_REUSEPORT``) and the kernel spreads connections
    over them. Not inheritable: a replica never holds it open."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await sock.bind((host, port))
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


def listener_port(listener: trio.SocketListener) -> int:
    return int(listener.socket.getsockname()[1])


@contextlib.contextmanager
def _own_socket(listener: trio.socket.SocketType) -> Iterator[socket.socket]:
    sock = socket.socket(
        listener.family, listener.type, listener.proto, fileno=os.dup(listener.fileno())
    )
    try:
        sock.setblocking(False)
        yield sock
    finally:
        close(sock)
