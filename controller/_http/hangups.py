"""Noticing clients that hang up while their answer is awaited, with one task per server.

A connection's task waits on the replica while a request is under way, so it cannot also wait
on its client. Instead of a second task per connection (or per request), each connection's
client socket is put, once, in one epoll set of the server's, asking only for the peer's
hang-up (``EPOLLRDHUP``: a FIN, and a reset are always reported), once: bytes the client sends
do not wake anyone. One task waits on that set (trio waits on the set's own descriptor) and
tells the connection whose client left, which cancels what it has under way, at the replica
too. One system call a connection (closing the socket takes it out of the set), none a request,
no task switch. A client that half-closes its side counts as one that hung up.

Without epoll (not Linux), nothing is watched: a client that hangs up is noticed when its
answer is written.
"""

from __future__ import annotations

import select
import socket
from typing import Protocol, final

import trio

_EPOLL = getattr(select, "epoll", None)
_EVENTS = getattr(select, "EPOLLRDHUP", 0) | getattr(select, "EPOLLONESHOT", 0)


class Watched(Protocol):
    def hang_up(self) -> None:
        """Its client hung up."""
        ...


@final
class Hangups:
    """The clients watched now, by socket descriptor."""

    def __init__(self) -> None:
        self._epoll = _EPOLL() if _EPOLL is not None else None
        self._watched: dict[int, Watched] = {}

    def watch(self, sock: socket.socket, owner: Watched) -> None:
        """Tell `owner` if `sock`'s peer hangs up; `forget` before closing `sock`."""
        if self._epoll is None:
            return
        fd = sock.fileno()
        self._epoll.register(fd, _EVENTS)
        self._watched[fd] = owner

    def forget(self, sock: socket.socket) -> None:
        """`sock` is about to close (which takes it out of the set)."""
        self._watched.pop(sock.fileno(), None)

    @property
    def watched(self) -> int:
        return len(self._watched)

    async def run(self) -> None:
        """Cancel the watched connections whose clients hang up, until cancelled."""
        if self._epoll is None:
            await trio.sleep_forever()
        while True:
            await trio.lowlevel.wait_readable(self._epoll.fileno())
            for fd, _ in self._epoll.poll(0):
                owner = self._watched.get(fd)
                if owner is not None:
                    owner.hang_up()

    def close(self) -> None:
        """Once no connection is left (``run`` has ended too)."""
        if self._epoll is not None and not self._epoll.closed:
            self._epoll.close()
