"""A backend's recent events: bounded, timed on both clocks, and kept across restarts."""

from __future__ import annotations

import collections
import time
from typing import final

import trio

from ._checkpoint import EventRecord, EventsRecord, dump
from ._state import BackendEvent

#: How many recent events each backend keeps (in memory and in the store).
EVENTS_KEPT = 50


def plural(n: int, word: str) -> str:
    """``1 replica``, ``2 replicas``: counts in messages people read."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@final
class EventLog:
    """The last `EVENTS_KEPT` events of one backend, oldest first.

    Each event has its time on the trio clock (so tests under MockClock see exact times) and on
    the wall clock (for people, and to survive a restart, when the trio clock starts anew).
    """

    def __init__(self, name: str):
        self.name = name
        self.events: collections.deque[BackendEvent] = collections.deque(maxlen=EVENTS_KEPT)
        self.added = 0
        """How many events were added in this process: the writer stores the log when this
        differs from what it stored last."""

    def add(self, kind: str, message: str) -> None:
        self.events.append(BackendEvent(trio.current_time(), kind, message, time.time()))
        self.added += 1

    def restore(self, record: EventsRecord | None) -> None:
        """Take the events a previous controller stored. Their trio times are put on this
        process's clock, so that the order and the ages stay right."""
        self.events.clear()
        if record is None:
            return
        now, wall = trio.current_time(), time.time()
        for e in record.events[-EVENTS_KEPT:]:
            at = e.at_ms / 1000
            self.events.append(BackendEvent(now - (wall - at), e.kind, e.message, at))

    def text(self) -> str:
        """The log as stored."""
        return dump(
            EventsRecord(
                self.name,
                [
                    EventRecord(round((e.wall_time or 0.0) * 1000), e.kind, e.message)
                    for e in self.events
                ],
            )
        )
