"""A backend loop's inbox: the events sent to it, in order."""

from __future__ import annotations

from typing import final

import trio

from . import events as ev


@final
class Mailbox:
    """The events sent to a backend's loop: any number, from anyone, and a send never blocks
    (some are sent from the runtime's callbacks); one receiver, the loop.

    What trio's unbounded memory channel gives, for a fraction of its memory: a controller may
    hold thousands of backends, and each channel holds ~1.7 KB at rest (a deque's first block,
    two tables of waiting tasks, two channel objects); this holds a list and the one task
    that may wait. A receive is a checkpoint, as the channel's is."""

    __slots__ = ("_events", "_next", "_waiting")

    def __init__(self) -> None:
        self._events: list[ev.Event] = []
        self._next = 0
        """The index of the first event not yet received."""
        self._waiting: trio.lowlevel.Task | None = None

    def send_nowait(self, event: ev.Event) -> None:
        self._events.append(event)
        if self._waiting is not None:
            trio.lowlevel.reschedule(self._waiting)
            self._waiting = None

    def receive_nowait(self) -> ev.Event:
        """The next event; `trio.WouldBlock` if there is none."""
        if self._next >= len(self._events):
            raise trio.WouldBlock
        event = self._events[self._next]
        self._next += 1
        if self._next == len(self._events):
            # All received: the list starts anew, and lets go of what it held.
            self._events.clear()
            self._next = 0
        return event

    async def receive(self) -> ev.Event:
        """The next event, waiting for one if there is none."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._next < len(self._events):
            await trio.lowlevel.cancel_shielded_checkpoint()
            return self.receive_nowait()
        assert self._waiting is None, "a mailbox has one receiver"
        self._waiting = trio.lowlevel.current_task()

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            self._waiting = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        return self.receive_nowait()
