"""One lock per backend name, kept only while the name is in use."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from typing import final

import trio


@final
class Held:
    """The locks one holder took, released in the order they were taken: trio looks a lock up
    in its owner's list of held locks from the first taken, so releasing the last first costs a
    scan of all of them per lock (seconds for an apply of 20,000 backends)."""

    def __init__(self, locks: Mapping[str, trio.Lock]):
        self._locks = locks
        self._taken: list[trio.Lock] = []
        self._after: list[Callable[[], object]] = []

    async def take(self, name: str) -> None:
        lock = self._locks[name]
        await lock.acquire()
        self._taken.append(lock)

    def after_release(self, action: Callable[[], object]) -> None:
        """Run `action` once every lock is released (before the names' own are dropped)."""
        self._after.append(action)

    def release(self) -> None:
        taken, self._taken = self._taken, []
        for lock in taken:
            lock.release()
        after, self._after = self._after, []
        for action in reversed(after):
            action()


@final
class NameLocks:
    """A deploy, a delete and the final forgetting of a deleted backend never overlap for one
    name. A name's lock goes once nothing uses it (no backend of that name, no holder, no one
    waiting), so that churn through many names leaves nothing behind."""

    def __init__(self, in_use: Callable[[str], bool]):
        self._in_use = in_use
        self._locks: collections.defaultdict[str, trio.Lock] = collections.defaultdict(trio.Lock)

    def __getitem__(self, name: str) -> trio.Lock:
        return self._locks[name]

    def __len__(self) -> int:
        return len(self._locks)

    def names(self) -> list[str]:
        """The names in use now: a backend's, or one a change holds or waits for."""
        return list(self._locks)

    @asynccontextmanager
    async def hold(self, names: Collection[str]) -> AsyncIterator[Held]:
        """Hold the locks of `names`, taken in sorted order so that no two callers deadlock.
        More can be taken through the `Held` yielded; all are dropped on the way out if
        unused."""
        held = Held(self._locks)
        try:
            for name in sorted(names):
                await held.take(name)
            yield held
        finally:
            held.release()
            self.drop(list(names))

    def drop(self, names: Collection[str], *, held_here: bool = False) -> None:
        """Drop the locks of `names` not in use (the caller's own hold aside, if `held_here`:
        it is done with it)."""
        for name in names:
            lock = self._locks.get(name)
            if (
                lock is not None
                and not self._in_use(name)
                and (held_here or not lock.locked())
                and lock.statistics().tasks_waiting == 0
            ):
                del self._locks[name]
