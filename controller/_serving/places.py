"""A replica's places for handlers: at most `limit` run at once, the others wait in line, first
come first served. The limit may change at any time (its backend's ``max_ongoing_requests``
changed): a higher one lets those waiting in at once, a lower one lets no one more in until
enough have left."""

from __future__ import annotations

import collections
from typing import final

import trio


@final
class Places:
    def __init__(self, limit: int):
        self.limit = limit
        self.taken = 0
        self._line: collections.deque[trio.Event] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._line)

    async def take(self) -> None:
        """Take a place, waiting in line for one if none is free. A caller cancelled while it
        waits leaves the line, or, had it just been let in, gives its place back."""
        if self.taken < self.limit and not self._line:
            self.taken += 1
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        let_in = trio.Event()
        self._line.append(let_in)
        try:
            await let_in.wait()
        except BaseException:
            if let_in.is_set():
                self.give_back()  # let in just as it gave up: the place goes to the next
            else:
                self._line.remove(let_in)
            raise

    def give_back(self) -> None:
        self.taken -= 1
        self._let_in()

    def resize(self, limit: int) -> None:
        self.limit = limit
        self._let_in()

    def _let_in(self) -> None:
        while self._line and self.taken < self.limit:
            self.taken += 1
            self._line.popleft().set()
