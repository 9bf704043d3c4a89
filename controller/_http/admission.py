"""Which client connections a server takes, as a pure bookkeeping of counts: at most
`max_connections` in all and `per_client` from one address; at the limit, the connection idle
the longest (waiting for a request, none under way) is closed to make room, and only if none
is idle is the newcomer refused. No I/O and no trio: the caller closes what it is told to."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Literal, final

import attrs

Refusal = Literal["per_client", "limit"]


@attrs.frozen
class Verdict:
    """What to do with a new connection."""

    refused: Refusal | None = None
    """Why it is closed unserved; None: it is served (and counted)."""
    evict: Hashable | None = None
    """An idle connection to close first, to make room for it (the caller `leave`s it)."""


@final
class Admission:
    """The open connections, by client address, and those idle, oldest first."""

    def __init__(self, max_connections: int, per_client: int):
        self.max_connections = max_connections
        self.per_client = per_client
        self.open = 0
        self.closing = False
        """The server is closing: connections end after the request under way."""
        self._by_client: dict[str, int] = {}
        # Insertion order is idle-since order: a connection that turns idle goes to the end.
        self._idle: dict[Hashable, None] = {}

    def admit(self, client: str) -> Verdict:
        """Whether a new connection from `client` is served (then it is counted)."""
        if self._by_client.get(client, 0) >= self.per_client:
            return _PER_CLIENT
        evict: Hashable | None = None
        if self.open >= self.max_connections:
            if not self._idle:
                return _LIMIT
            evict = next(iter(self._idle))
            del self._idle[evict]
        self.open += 1
        self._by_client[client] = self._by_client.get(client, 0) + 1
        return Verdict(evict=evict) if evict is not None else _SERVED

    def leave(self, client: str, conn: Hashable) -> None:
        """A connection admitted for `client` has closed."""
        self._idle.pop(conn, None)
        self.open -= 1
        left = self._by_client[client] - 1
        if left:
            self._by_client[client] = left
        else:
            del self._by_client[client]

    def idle(self, conn: Hashable, idle: bool) -> None:
        """`conn` waits for a request with none under way (`idle`), or no longer does."""
        if idle:
            self._idle.pop(conn, None)
            self._idle[conn] = None
        else:
            self._idle.pop(conn, None)

    def idle_connections(self) -> list[Hashable]:
        return list(self._idle)

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    def clients(self) -> int:
        return len(self._by_client)


_SERVED = Verdict()
_PER_CLIENT = Verdict(refused="per_client")
_LIMIT = Verdict(refused="limit")
