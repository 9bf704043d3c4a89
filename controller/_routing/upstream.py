"""Connections to replicas: kept open and reused per replica address, when nothing was left
unread on either side."""

from __future__ import annotations

import errno
import socket
from typing import final

import trio

from .._http.sockets import close, connect, is_idle_and_open

#: Set by the ingress on a request whose body is an upload (too large to read before choosing a
#: replica): code the worker serves runs it without waiting for one of its
#: ``max_ongoing_requests`` places, which the ingress's upload budget stands for, so that a slow
#: body takes no request's place. A client's own is dropped at the ingress.
UPLOAD_HEADER = b"x-controller-upload"
#: Idle connections kept per replica; more are closed when their request ends.
MAX_IDLE_PER_REPLICA = 64
#: A kept connection idle for less than this is taken without first checking that the replica
#: has not closed it: no server closes a keep-alive connection that young for being idle, and
#: one closed by a replica that died meanwhile is caught by the answer that never begins (the
#: proxy then sends a request that may be sent again, once more, on a new connection).
TRUSTED_IDLE_S = 1.0


class NotSent(Exception):
    """The request could not be sent, and none of it reached the replica: safe to retry on
    another one (a refused connection, or one reset before the request went out)."""


class Lost(NotSent):
    """A replica closed (or reset) a new connection before any answer to a request that may
    be sent twice (an idempotent method, no body): it died with the request, which goes to
    another replica as one that was never sent does."""


class Stale(Exception):
    """A kept connection turned out closed by the replica before it answered anything: a
    request that may be sent twice is sent again on a new connection."""


@final
class Upstream:
    """One connection to a replica."""

    __slots__ = ("address", "body_sent", "idle_since", "reusable", "reused", "sock")

    def __init__(self, address: str, sock: socket.socket):
        self.address = address
        self.sock = sock
        self.idle_since = 0.0
        self.reused = False
        """It carried a request before this one."""
        self.body_sent = False
        """A request body went out on it: the replica may have answered without reading it all
        (an early 401 or 413), and what it left unread would be read as the next request."""
        self.reusable = False
        """Both sides are done with the last exchange and nothing is left over: it may carry
        the next request."""


@final
class Pool:
    """Idle connections per replica address, newest last (reused first: warm in the cache)."""

    def __init__(self, connect_timeout_s: float = 5.0):
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[str, list[Upstream]] = {}
        self.opened = 0
        """Connections opened in all (a reused one adds nothing): for tests and the benchmark."""

    async def get(self, address: str, *, check: bool = True) -> Upstream:
        """A kept connection to `address` that is still open and silent, or a new one.
        ``NotSent`` if none can be had within connect_timeout_s. Without `check`, one idle
        for less than `TRUSTED_IDLE_S` is taken unchecked (the caller can send again)."""
        idle = self._idle.get(address)
        if idle:
            now = trio.current_time()
            while idle:
                upstream = idle.pop()
                young = now - upstream.idle_since < TRUSTED_IDLE_S
                if (young and not check) or is_idle_and_open(upstream.sock):
                    upstream.reusable = upstream.body_sent = False
                    upstream.reused = True
                    return upstream
                close(upstream.sock)
        host, _, port = address.rpartition(":")
        sock = None
        with trio.move_on_after(self.connect_timeout_s):
            try:
                sock = await connect(host.strip("[]"), int(port))
            except (OSError, ValueError) as exc:
                raise NotSent(f"cannot connect to {address}: {_why(exc)}") from None
        if sock is None:
            raise NotSent(f"cannot connect to {address}: no answer to the connection")
        self.opened += 1
        return Upstream(address, sock)

    def put(self, upstream: Upstream) -> None:
        """Keep `upstream` for the next request to its replica, if it can take one."""
        idle = self._idle.setdefault(upstream.address, [])
        if not upstream.reusable or len(idle) >= MAX_IDLE_PER_REPLICA:
            close(upstream.sock)
            return
        upstream.idle_since = trio.current_time()
        idle.append(upstream)

    def forget(self, address: str) -> None:
        """Close the idle connections to a replica that left."""
        for upstream in self._idle.pop(address, ()):
            close(upstream.sock)

    def forget_all(self, addresses: list[str]) -> None:
        """Close the idle connections to replicas that left."""
        for address in addresses:
            self.forget(address)

    def close_all(self) -> None:
        for address in list(self._idle):
            self.forget(address)


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED:
        return "connection refused"
    return str(exc) or type(exc).__name__
