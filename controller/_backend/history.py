"""A backend's recent events: bounded, timed on both clocks, and kept across restarts."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import final

import trio

from .._clock import wall_now
from .._model.decisions.spec import Spec
from .._model.records.checkpoint import dump_event, join_events
from .._model.records.records import EventRecord, EventsRecord
from .._model.views.status import BackendEvent, FailedStart
from .observe import Observer

logger = logging.getLogger("controller")

#: How many recent events each backend keeps (in memory and in the store).
EVENTS_KEPT = 50
#: How many failed starts each backend's status shows: a failed deploy's (3 by default) and
#: a few more, not the whole of a crash loop's tracebacks.
FAILED_STARTS_KEPT = 5


def plural(n: int, word: str) -> str:
    """``1 replica``, ``2 replicas``: counts in messages people read."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def decision_line(
    version: str, started: Sequence[str], stopped_versions: Sequence[str], updates: int
) -> str:
    """One line per decision, each count with the version it concerns: a rollout's line names
    the version it stops as well as the one it starts (a canary's, the two it starts)."""
    parts = []
    if started:
        parts.append(f"starting {len(started)} ({_versions(started)})")
    if stopped_versions:
        parts.append(f"stopping {len(stopped_versions)} ({_versions(stopped_versions)})")
    if updates:
        parts.append(f"reconfiguring {updates} (version {version})")
    return ", ".join(parts)


def _versions(versions: Sequence[str]) -> str:
    """``version v1``, or ``2 of v1, 1 of v2``."""
    by_version: dict[str, int] = {}
    for v in versions:
        by_version[v] = by_version.get(v, 0) + 1
    if len(by_version) == 1:
        return f"version {next(iter(by_version))}"
    return ", ".join(f"{n} of {v}" for v, n in sorted(by_version.items()))


@final
class EventLog:
    """The last `EVENTS_KEPT` events of one backend, oldest first.

    Each event has its time on the trio clock (so tests under MockClock see exact times) and on
    the wall clock (for people, and to survive a restart, when the trio clock starts anew).
    """

    def __init__(self, name: str):
        self.name = name
        # Lists, not deques of `EVENTS_KEPT`: a backend at rest has a few events, and a deque
        # holds a block of 64 slots from the start (~600 bytes a backend).
        self.events: list[BackendEvent] = []
        # Each event's stored text, made once: the log is stored with every checkpoint that
        # adds an event, and re-encoding all 50 each time was a good part of a crash's cost.
        self._texts: list[str] = []
        self.added = 0
        """How many events were added in this process: the writer stores the log when this
        differs from what it stored last."""

    def add(self, kind: str, message: str) -> None:
        self._append(BackendEvent(trio.current_time(), kind, message, wall_now()))
        self.added += 1

    def _append(self, event: BackendEvent) -> None:
        self.events.append(event)
        at_ms = round((event.wall_time or 0.0) * 1000)
        self._texts.append(dump_event(EventRecord(at_ms, event.kind, event.message)))
        if len(self.events) > EVENTS_KEPT:
            del self.events[0]
            del self._texts[0]

    def restore(self, record: EventsRecord | None) -> None:
        """Take the events a previous controller stored. Their trio times are put on this
        process's clock, so that the order and the ages stay right."""
        self.events.clear()
        self._texts.clear()
        if record is None:
            return
        now, wall = trio.current_time(), wall_now()
        for e in record.events[-EVENTS_KEPT:]:
            at = e.at_ms / 1000
            self._append(BackendEvent(now - (wall - at), e.kind, e.message, at))

    def text(self) -> str:
        """The log as stored (what ``dump(EventsRecord(...))`` makes of the events)."""
        return join_events(self.name, self._texts)


@final
class Journal:
    """What a backend tells of itself, in one place: its events (kept, and stored once `changed`
    has been called), its log lines, its failure metrics, its latest error and failed starts."""

    def __init__(self, name: str, observer: Observer, changed: Callable[[], None]):
        self.name = name
        self.log = EventLog(name)
        self.last_error: str | None = None
        """The most recent failure of any generation, until the backend is healthy again."""
        self.last_traceback: str | None = None
        self.failed_starts: tuple[FailedStart, ...] = ()
        """The latest failed starts of any generation, until the backend is healthy again. A
        tuple, not a bounded deque: most backends have none, and an empty deque holds a block
        of 64 slots (~600 bytes a backend)."""
        self._observer = observer
        self._changed = changed

    def event(self, kind: str, message: str) -> None:
        self.log.add(kind, message)
        self._changed()

    def failure(
        self, tag: str, kind: str, error: str, then: str, traceback: str | None = None
    ) -> None:
        """A replica failed (`kind`); `then` says what follows (the backoff)."""
        self.last_error, self.last_traceback = error, traceback
        self._observer.failure(self.name, kind)
        if traceback:
            logger.warning(
                "replica %s: %s (%s); its traceback:\n%s", tag, error, then, traceback.rstrip()
            )
        else:
            logger.warning("replica %s: %s (%s)", tag, error, then)
        self.event(kind, f"replica {tag}: {error}; {then}")

    def unhealthy(self, error: str) -> None:
        """A replica failed a health check, below its threshold: it serves no more, and the
        status says why while it does not (an event tells each failed check)."""
        self.last_error, self.last_traceback = f"unhealthy: {error}", None

    def start_failed(self, tag: str, version: str, error: str, traceback: str | None) -> None:
        """Kept for the status (the replica itself is about to go); told by ``failure``."""
        failed = FailedStart(tag, version, error, traceback, wall_now())
        self.failed_starts = (*self.failed_starts, failed)[-FAILED_STARTS_KEPT:]

    def healthy(self) -> None:
        """The backend is healthy again (converged, every replica passing its checks, no failed
        deploy): its earlier failures are history, which the events keep, not its status."""
        self.last_error = self.last_traceback = None
        self.failed_starts = ()

    def decision(
        self, version: str, started: Sequence[str], stopped_versions: Sequence[str], updates: int
    ) -> None:
        """A pass's starts, stops and reconfigures: logged; an event if it starts or stops."""
        if started or stopped_versions or updates:
            line = decision_line(version, started, stopped_versions, updates)
            logger.info("backend %s: %s", self.name, line)
            if started or stopped_versions:
                # Reconfigures are told replica by replica; the event is about the count.
                self.event("Scale", decision_line(version, started, stopped_versions, 0))

    def recovered(self, generation: int, live: int) -> None:
        self.event("Recovered", f"generation {generation}: adopting {plural(live, 'live replica')}")

    def reached(self, generation: int) -> None:
        logger.info("backend %s: goal of generation %d reached", self.name, generation)
        self.event("Ready", f"generation {generation} reached")

    def deploy_failed(self, reason: str, kind: str = "DeployFailed") -> None:
        logger.error("backend %s: deploy failed: %s", self.name, reason)
        self.event(kind, reason)


def log_spec_change(name: str, spec: Spec) -> None:
    """The log's line of a new spec (a deploy or a delete) of `name`."""
    if spec.deleting:
        forced = ", forced" if spec.force else ""
        logger.info("backend %s: delete (generation %d%s)", name, spec.generation, forced)
        return
    logger.info(
        "backend %s: deploy generation %d: %s of version %s",
        name,
        spec.generation,
        plural(spec.backend_config.num_replicas, "replica"),
        spec.version,
    )
