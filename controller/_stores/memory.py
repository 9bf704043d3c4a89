"""A store that keeps checkpoints in memory: for tests, and for controllers that need no restart."""

from __future__ import annotations

from collections.abc import Mapping
from typing import final

import attrs
import trio

from .._model.decisions.lease import Lease, same_grant
from .._model.values.errors import FencedError


@final
@attrs.define(eq=False)
class MemoryStore:
    """Checkpoints in a dict. Hand the same instance to a new controller to simulate a restart."""

    data: dict[str, str] = attrs.field(factory=dict)
    """The stored keys and their JSON text; tests may read or corrupt it."""
    writes: int = 0
    """How many ``write`` calls landed."""
    lease: Lease | None = None
    """The lease daemons sharing this store elect a leader with (``write_fenced``)."""
    fenced: int = 0
    """How many fenced writes and renewals were refused (a stale epoch's)."""

    async def read_all(self) -> dict[str, str]:
        await trio.lowlevel.checkpoint()
        return dict(self.data)

    async def write(self, changes: Mapping[str, str | None]) -> None:
        # A checkpoint first, like a real store's I/O, so that callers cannot rely on writes
        # being synchronous.
        await trio.lowlevel.checkpoint()
        self._apply(changes)

    def _apply(self, changes: Mapping[str, str | None]) -> None:
        for key, text in changes.items():
            if text is None:
                self.data.pop(key, None)
            else:
                self.data[key] = text
        self.writes += 1

    async def read_lease(self) -> Lease | None:
        await trio.lowlevel.checkpoint()
        return self.lease

    async def claim_lease(self, seen: Lease | None, new: Lease) -> bool:
        await trio.lowlevel.checkpoint()
        if not same_grant(self.lease, seen):
            return False
        self.lease = new
        return True

    async def renew_lease(self, lease: Lease) -> None:
        await trio.lowlevel.checkpoint()
        self._check_epoch("renewing the lease", lease.epoch)
        self.lease = lease

    async def write_fenced(self, epoch: int, changes: Mapping[str, str | None]) -> None:
        await trio.lowlevel.checkpoint()
        # Compared and written with no checkpoint between: one atomic step, as in a real store.
        self._check_epoch("writing intent", epoch)
        self._apply(changes)

    def _check_epoch(self, what: str, epoch: int) -> None:
        held = self.lease.epoch if self.lease is not None else 0
        if held != epoch:
            self.fenced += 1
            raise FencedError(what, epoch, held)
