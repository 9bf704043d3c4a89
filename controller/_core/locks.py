"""One lock per backend name, kept only while the name is in use."""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import AsyncExitStack, asynccontextmanager
from typing import final

import trio


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
    async def hold(self, names: Collection[str]) -> AsyncIterator[AsyncExitStack]:
        """Hold the locks of `names`, taken in sorted order so that no two callers deadlock.
        More can be entered on the stack yielded; all are dropped on the way out if unused."""
        async with AsyncExitStack() as stack:
            stack.callback(self.drop, list(names))
            for name in sorted(names):
                await stack.enter_async_context(self._locks[name])
            yield stack

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
