"""Every client connection's deadline, kept by one task per server.

A connection has one deadline at a time (its first byte, its head, a stalled body, the
replica's answer, an idle keep-alive...), moved at each step of each request. Through trio, each
move is a cancel scope made or moved; here it is an attribute written. A connection's entry
in the heap is its *armed* time: a deadline moved later leaves it, and when it comes due the
connection is found not due yet and armed again for its real deadline (no heap work on the
request path); only a deadline moved earlier than the armed one is pushed. The task sleeps
until the earliest armed time, and cancels the scope of a connection whose deadline has passed,
naming the phase it was in.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Protocol, final

import trio


class Timed(Protocol):
    """What a timer holds of a connection."""

    deadline: float
    phase: str

    def expire(self, phase: str) -> None:
        """The deadline of `phase` has passed."""
        ...


@final
class Timer:
    """One connection's place in `Timers`: `set` moves its deadline."""

    __slots__ = ("_armed", "_entry", "_owner", "_timers")

    def __init__(self, timers: Timers, owner: Timed):
        self._timers = timers
        self._owner = owner
        self._armed = math.inf
        self._entry: list[Any] | None = None

    def set(self, when: float, phase: str) -> None:
        """From now on the connection expires at `when` (``math.inf``: never), in `phase`."""
        owner = self._owner
        owner.deadline, owner.phase = when, phase
        if when < self._armed:
            self._arm(when)

    def _arm(self, when: float) -> None:
        if self._entry is not None:
            self._entry[2] = None  # superseded: dropped when it comes due
        self._armed = when
        self._entry = entry = [when, self._timers.next_seq(), self]
        self._timers.push(entry)

    def fire(self, now: float) -> None:
        """The armed time has come: expire the connection, or arm again for its deadline."""
        self._entry = None
        self._armed = math.inf
        owner = self._owner
        if owner.deadline <= now:
            owner.expire(owner.phase)
        elif owner.deadline < math.inf:
            self._arm(owner.deadline)

    def cancel(self) -> None:
        """The connection is closed: its entry holds nothing of it any more."""
        if self._entry is not None:
            self._entry[2] = None
            self._entry = None
        self._armed = -math.inf  # never armed again


@final
class Timers:
    """The heap of armed times, and the task that keeps them."""

    def __init__(self) -> None:
        # Entries are [when, sequence, timer]; a superseded one's timer is None.
        self._heap: list[list[Any]] = []
        self._seq = 0
        self._waking_at = math.inf
        self._sleep: trio.CancelScope | None = None

    def timer(self, owner: Timed) -> Timer:
        return Timer(self, owner)

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def push(self, entry: list[Any]) -> None:
        heapq.heappush(self._heap, entry)
        if entry[0] < self._waking_at and self._sleep is not None:
            self._sleep.cancel()  # due before the task wakes: wake it now

    def __len__(self) -> int:
        return len(self._heap)

    async def run(self) -> None:
        """Expire connections as their deadlines pass, until cancelled."""
        heap = self._heap
        while True:
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                timer = heapq.heappop(heap)[2]
                if timer is not None:
                    timer.fire(now)
            self._waking_at = heap[0][0] if heap else math.inf
            with trio.CancelScope(deadline=self._waking_at) as self._sleep:
                await trio.sleep_forever()
            self._sleep = None
