"""Watch: the latest snapshot of every backend, and a long poll that wakes on any change."""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import final

import attrs
import trio

from .._model.values.errors import ControllerClosedError
from .._model.views.status import BackendSnapshot

#: Tombstones kept for watchers that were away; older ones are dropped (``SnapshotHub.floor``).
TOMBSTONES_KEPT = 10_000


@final
@attrs.define(eq=False)
class SnapshotHub:
    """Holds the newest snapshot per backend. Ids come from one counter, so they only grow.

    A deleted backend leaves a tombstone (a snapshot with no config), so a watcher that was away
    still learns of the deletion. The newest `TOMBSTONES_KEPT` are kept, so that name churn does
    not grow memory: `floor` is the newest id dropped, and a name not held here reads as a
    tombstone at that id, so that a watcher holding an older snapshot of it learns it is gone.
    """

    _latest: dict[str, BackendSnapshot] = attrs.field(factory=dict, init=False)
    _tombstones: collections.OrderedDict[str, None] = attrs.field(
        factory=collections.OrderedDict, init=False
    )
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    _last_id: int = attrs.field(default=0, init=False)
    floor: int = attrs.field(default=0, init=False)
    """The newest id of a dropped tombstone (0: none dropped)."""
    _closed: bool = attrs.field(default=False, init=False)

    @property
    def last_id(self) -> int:
        """The id of the newest snapshot published (0: none yet)."""
        return self._last_id

    def next_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def publish(self, snapshot: BackendSnapshot) -> None:
        name = snapshot.name
        self._latest[name] = snapshot
        self._tombstones.pop(name, None)
        if not snapshot.exists:
            self._tombstones[name] = None
            if len(self._tombstones) > TOMBSTONES_KEPT:
                oldest, _ = self._tombstones.popitem(last=False)
                self.floor = max(self.floor, self._latest.pop(oldest).snapshot_id)
        # Wake every listener once; the next listen() waits on a fresh event.
        self._changed.set()
        self._changed = trio.Event()

    def close(self) -> None:
        """The controller closed: every listener, now and later, gets ControllerClosedError."""
        self._closed = True
        self._changed.set()

    def get(self, name: str) -> BackendSnapshot:
        snapshot = self._latest.get(name)
        if snapshot is None:
            return BackendSnapshot(name, self.floor, None, None, ())
        return snapshot

    def newer(
        self, snapshot_ids: Mapping[str, int], *, everything: bool
    ) -> dict[str, BackendSnapshot]:
        """Snapshots newer than `snapshot_ids` (and, with `everything`, of unlisted backends)."""
        out: dict[str, BackendSnapshot] = {}
        for name, known in snapshot_ids.items():
            snapshot = self.get(name)
            if snapshot.snapshot_id > known:
                out[name] = snapshot
        if everything:
            for name, snapshot in self._latest.items():
                if name not in snapshot_ids:
                    out[name] = snapshot
        return out

    async def listen(
        self, snapshot_ids: Mapping[str, int], *, everything: bool
    ) -> dict[str, BackendSnapshot]:
        while True:
            self._check_open()
            out = self.newer(snapshot_ids, everything=everything)
            if out:
                return out
            await self._changed.wait()

    async def listen_since(self, snapshot_id: int) -> list[BackendSnapshot]:
        """Every latest snapshot with an id above `snapshot_id`, oldest first; waits for one."""
        while True:
            self._check_open()
            out = sorted(
                (s for s in self._latest.values() if s.snapshot_id > snapshot_id),
                key=lambda s: s.snapshot_id,
            )
            if out:
                return out
            await self._changed.wait()

    def _check_open(self) -> None:
        if self._closed:
            raise ControllerClosedError("the controller is closed; its watch has ended")


@final
class SnapshotStream:
    """The snapshots of one backend, as an async iterator that ends only with the controller
    (``ControllerClosedError``)."""

    def __init__(self, hub: SnapshotHub, name: str):
        self._hub = hub
        self._name = name
        self._known = 0

    def __aiter__(self) -> SnapshotStream:
        return self

    async def __anext__(self) -> BackendSnapshot:
        snapshot = (await self._hub.listen({self._name: self._known}, everything=False))[self._name]
        self._known = snapshot.snapshot_id
        return snapshot
