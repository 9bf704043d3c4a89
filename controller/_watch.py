"""Watch: the latest snapshot of every backend, and a long poll that wakes on any change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import final

import attrs
import trio

from ._state import BackendSnapshot


@final
@attrs.define(eq=False)
class SnapshotHub:
    """Holds the newest snapshot per backend. Ids come from one counter, so they only grow.

    A deleted backend leaves a tombstone (a snapshot with no config), so a watcher that was away
    still learns of the deletion.
    """

    _latest: dict[str, BackendSnapshot] = attrs.field(factory=dict, init=False)
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    _last_id: int = attrs.field(default=0, init=False)

    def next_id(self) -> int:
        self._last_id += 1
        return self._last_id

    def publish(self, snapshot: BackendSnapshot) -> None:
        self._latest[snapshot.name] = snapshot
        # Wake every listener once; the next listen() waits on a fresh event.
        self._changed.set()
        self._changed = trio.Event()

    def get(self, name: str) -> BackendSnapshot:
        snapshot = self._latest.get(name)
        if snapshot is None:
            return BackendSnapshot(name, 0, None, None, ())
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
            out = self.newer(snapshot_ids, everything=everything)
            if out:
                return out
            await self._changed.wait()

    async def listen_since(self, snapshot_id: int) -> list[BackendSnapshot]:
        """Every latest snapshot with an id above `snapshot_id`, oldest first; waits for one."""
        while True:
            out = sorted(
                (s for s in self._latest.values() if s.snapshot_id > snapshot_id),
                key=lambda s: s.snapshot_id,
            )
            if out:
                return out
            await self._changed.wait()
