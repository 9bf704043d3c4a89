"""Answers that arrive one by one, taken in bursts by one task: for runtimes that wait on many
replicas at once (a wave of health checks), so that the answers that come together cost the
waiting task one wake-up, not one each."""

from __future__ import annotations

from typing import Generic, TypeVar, final

import trio

T = TypeVar("T")


@final
class Arrivals(Generic[T]):
    """Items handed in with ``put`` (from the trio thread: a reader's callback, or a thread's
    through ``run_sync_soon``), taken by one task with ``take``."""

    def __init__(self) -> None:
        self._items: list[T] = []
        self._waiting: trio.lowlevel.Task | None = None

    def put(self, item: T) -> None:
        self._items.append(item)
        if self._waiting is not None:
            task, self._waiting = self._waiting, None
            trio.lowlevel.reschedule(task)

    async def take(self) -> list[T]:
        """Every item put since the last take: at once if there are some, else once one comes."""
        if self._items:
            await trio.lowlevel.checkpoint_if_cancelled()
        else:
            self._waiting = trio.lowlevel.current_task()

            def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
                self._waiting = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        items, self._items = self._items, []
        return items
