"""A backend's watch snapshot: when it is due, and what multiplexed replicas say they hold.

A snapshot is published only when something watchers see changed (``changed``), and a change of
what a replica holds of its models publishes at most every HELD_PUBLISH_S: a replica loading
models all the time must not have every ingress fetch the backend again each time."""

from __future__ import annotations

import math

import trio

from .._model.records.multiplexing import Held
from . import view as view
from .loop_state import LoopState
from .watch import SnapshotHub

#: How often, at most, a change of what multiplexed replicas hold alone publishes a snapshot.
HELD_PUBLISH_S = 1.0


class Snapshot:
    def __init__(self, state: LoopState, hub: SnapshotHub):
        self._state = state
        self._hub = hub
        self._dirty = True
        self._held: dict[str, Held] = {}
        """What each multiplexed replica said it holds."""
        self._held_published_at = -math.inf
        self._held_due = False  # a timer brings a tick once HELD_PUBLISH_S is past
        self._tick_at = math.inf
        """When a tick is to come, asked of no timer yet (``take_tick``)."""

    def changed(self) -> None:
        """What watchers see changed: the next `publish` sends a snapshot."""
        self._dirty = True

    def publish(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        state = self._state
        self._hub.publish(
            view.snapshot_of(
                state.name,
                self._hub.next_id(),
                state.spec,
                state.set.serving,
                state.forgotten,
                state.canary.traffic(state.spec),
                self._held,
            )
        )

    def held(self, tag: str, held: Held) -> bool:
        """What replica `tag` says it holds now; True if that is due in a snapshot now."""
        if self._held.get(tag) == held:
            return False
        self._held[tag] = held
        due = self._held_published_at + HELD_PUBLISH_S - trio.current_time()
        if due <= 0:
            self._publish_held()
            return True
        if not self._held_due:
            self._held_due = True
            self._tick_at = self._held_published_at + HELD_PUBLISH_S
        return False

    def take_tick(self) -> float:
        """When a tick must come (it brings what changed between two publications), once: the
        executor sets the timer; inf if none is newly due."""
        at, self._tick_at = self._tick_at, math.inf
        return at

    def tick(self, at: float) -> None:
        if self._held_due and at >= self._held_published_at + HELD_PUBLISH_S:
            self._held_due = False
            self._publish_held()

    def gone(self, tag: str) -> None:
        self._held.pop(tag, None)

    def _publish_held(self) -> None:
        self._held_published_at = trio.current_time()
        self._dirty = True
