"""The Store protocol: where the controller keeps its intent. A flat map of keys to JSON text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .._model.decisions.lease import Lease


class Store(Protocol):
    """Durable key-value storage for checkpoints.

    ``write`` is atomic: every change in one call lands, or none does. When it returns, the
    changes survive a crash of the controller. Writes issued concurrently may be grouped into one
    transaction; a later write of a key wins over an earlier one.
    """

    async def read_all(self) -> dict[str, str]:
        """Every key and its text."""
        ...

    async def write(self, changes: Mapping[str, str | None]) -> None:
        """Set each key to its text; None deletes the key."""
        ...


class LeaseStore(Store, Protocol):
    """A Store that daemons sharing it can elect a leader through
    (``controller._model.decisions.lease``), and that writes intent only for the leader's epoch
    (fencing). SQLiteStore, RayKVStore and MemoryStore are such stores.

    Each call is one atomic step of the store: its compare and its write cannot be split by
    another writer's.
    """

    async def read_lease(self) -> Lease | None:
        """The lease as stored now (None: never claimed)."""
        ...

    async def claim_lease(self, seen: Lease | None, new: Lease) -> bool:
        """Store `new` (whose epoch is the one after `seen`'s) if the lease is still as `seen`
        shows it (the same epoch, renewals, holder and release; None: no lease); say whether
        it was stored."""
        ...

    async def renew_lease(self, lease: Lease) -> None:
        """Store `lease` (a renewal or release of the one held) if the stored lease still has
        its epoch; else raise ``FencedError``, storing nothing."""
        ...

    async def write_fenced(self, epoch: int, changes: Mapping[str, str | None]) -> None:
        """``write``, if the stored lease's epoch is `epoch`; else raise ``FencedError``, with
        nothing of `changes` written. The check and the write are one atomic step."""
        ...


@runtime_checkable
class Retirable(Protocol):
    """A store that keeps something running beside its data (RayKVStore: its fencing actor),
    to be removed once no daemon uses the store (a shutdown that no standby took over from)."""

    async def retire(self) -> None:
        """Remove it. A daemon that uses the store later makes it again."""
        ...
