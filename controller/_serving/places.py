"""A replica's places for handlers: requests come in while fewer than their limit run, the
others wait in line, first come first served.

The limit is each request's own: its backend's ``max_ongoing_requests`` as its router says it is
now (a change reaches the replica with the next request, restarting nothing), else the
replica's at its start. So what a request says decides its own admission only, never another's:
a client that reaches the replica's port directly and claims a higher limit can crowd in its
own requests (as it could by holding connections), not throttle or unbound anyone else's."""

from __future__ import annotations

import collections
from typing import final

import trio


@final
class _Waiting:
    __slots__ = ("let_in", "limit")

    def __init__(self, limit: int):
        self.limit = limit
        self.let_in = trio.Event()


@final
class Places:
    def __init__(self) -> None:
        self.taken = 0
        self._line: collections.deque[_Waiting] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._line)

    async def take(self, limit: int) -> None:
        """Take a place, once fewer than `limit` are taken and no one is ahead in line. A
        caller cancelled while it waits leaves the line, or, had it just been let in, gives its
        place back."""
        if self.taken < limit and not self._line:
            self.taken += 1
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        waiting = _Waiting(limit)
        self._line.append(waiting)
        try:
            await waiting.let_in.wait()
        except BaseException:
            if waiting.let_in.is_set():
                self.give_back()  # let in just as it gave up: the place goes to the next
            else:
                self._line.remove(waiting)
                self._let_in()  # it may have held up those behind it
            raise

    def give_back(self) -> None:
        self.taken -= 1
        self._let_in()

    def _let_in(self) -> None:
        while self._line and self.taken < self._line[0].limit:
            self.taken += 1
            self._line.popleft().let_in.set()
