"""Leadership, the pure part: the lease that daemons sharing one store elect a leader with, and
when a standby may claim it. No trio, no I/O: ``_leadership.keeper`` carries these decisions out.

The lease lives in the store beside the intent. Its `epoch` grows with every grant, and the store
writes intent only for the epoch it holds now (fencing), so a leader that slept through its lease
can write nothing once another has claimed it. A standby never compares the lease's times with
its own clock (clocks of two hosts differ): it watches the lease's renewal count, and claims once
that count has not moved for `duration_s` by its own monotonic clock, as Kubernetes' leader
election does.
"""

from __future__ import annotations

import json
import math
from typing import Any

import attrs

from ..values.errors import ConfigError, StoreError
from ..values.numbers import seconds

#: The defaults: a standby takes over within about `DURATION_S` + `RENEW_S` of the leader's last
#: renewal, and then recovers (adopts every replica) in well under a second on one host.
DURATION_S = 2.0
RENEW_S = 0.5
#: The shortest lease: shorter, an ordinary pause (a collection, a slow disk) loses it, and a
#: leader could lose it within its own recovery.
MIN_DURATION_S = 0.5
#: The shortest renew period: shorter, a standby's reads of the lease are a busy loop.
MIN_RENEW_S = 0.05
#: The largest epoch or renewal count a lease may hold: far beyond any real count, and below
#: SQLite's integer range, so that the next one always fits.
MAX_COUNT = 2**62


@attrs.frozen
class Lease:
    """Who leads the daemons of one store, as the store holds it."""

    epoch: int
    """The grant's number: each claim stores the one before it plus one."""
    holder: str
    """Who holds it: the daemon's host and state dir (a daemon restarted on the same state dir
    is the same holder, and takes its own lease back at once)."""
    duration_s: float
    """How long the holder may go without renewing before a standby may claim the lease."""
    renewals: int = 0
    """Bumped by each renewal: standbys watch it move."""
    address: str | None = None
    """The holder's API, where standbys send writes (None until it serves)."""
    pid: int | None = None
    """The holder's process, for people."""
    acquired_at: float = 0.0
    """When it was claimed, by the holder's wall clock (seconds since the epoch), for people."""
    renewed_at: float = 0.0
    """When it was last renewed, by the holder's wall clock, for people."""
    released: bool = False
    """Given up on purpose (a clean stop): a standby claims it at once."""

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Lease:
        """Parse a stored lease; a damaged one is a ``StoreError`` (nothing is claimed over it)."""
        try:
            data: Any = json.loads(text)
            if not isinstance(data, dict):
                raise TypeError("not an object")
            epoch, renewals = data["epoch"], data.get("renewals", 0)
            for name, value in (("epoch", epoch), ("renewals", renewals)):
                if type(value) is not int or not 0 <= value <= MAX_COUNT:
                    raise ValueError(f"{name} must be a whole number from 0 to 2**62")
            if epoch == MAX_COUNT:
                raise ValueError("epoch is at its limit (2**62): no claim can follow it")
            duration = data["duration_s"]
            if isinstance(duration, bool) or not isinstance(duration, (int, float)):
                raise ValueError("duration_s must be a number")
            if not (math.isfinite(duration) and duration > 0):
                raise ValueError("duration_s must be finite and > 0")
            holder = data["holder"]
            if not isinstance(holder, str):
                raise ValueError("holder must be a string")
            address, pid = data.get("address"), data.get("pid")
            if address is not None and not isinstance(address, str):
                raise ValueError("address must be a string")
            if pid is not None and type(pid) is not int:
                raise ValueError("pid must be a whole number")
            return cls(
                epoch=epoch,
                holder=holder,
                duration_s=float(duration),
                renewals=renewals,
                address=address,
                pid=pid,
                acquired_at=float(data.get("acquired_at", 0.0)),
                renewed_at=float(data.get("renewed_at", 0.0)),
                released=bool(data.get("released", False)),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise StoreError(f"the stored lease cannot be read ({exc}): {text[:200]!r}") from None


def _positive(field: str) -> Any:
    def check(_: object, attribute: attrs.Attribute[float], value: float) -> None:
        seconds(field, value, allow_zero=False)

    return check


@attrs.frozen
class LeaseTiming:
    """How a daemon keeps and watches the lease."""

    duration_s: float = attrs.field(default=DURATION_S, validator=_positive("lease_duration_s"))
    """How long a leader may go without renewing before a standby claims: the longest failover
    wait, and the shortest pause (a stall, a lost store) that costs a leader its lease."""
    renew_s: float = attrs.field(default=RENEW_S, validator=_positive("lease_renew_s"))
    """How often the leader renews and a standby reads the lease."""

    def __attrs_post_init__(self) -> None:
        if self.duration_s < MIN_DURATION_S:
            raise ConfigError(
                "lease_duration_s",
                f"must be at least {MIN_DURATION_S:g}s: an ordinary pause would cost a leader "
                "a shorter lease",
                self.duration_s,
            )
        if self.renew_s < MIN_RENEW_S:
            raise ConfigError(
                "lease_renew_s",
                f"must be at least {MIN_RENEW_S:g}s: shorter, reading the lease is a busy loop",
                self.renew_s,
            )
        if self.renew_s * 3 > self.duration_s:
            raise ConfigError(
                "lease_renew_s",
                f"must be at most a third of lease_duration_s ({self.duration_s:g}), so that "
                "a leader renews more than twice before its lease could lapse",
                self.renew_s,
            )

    @property
    def renew_deadline_s(self) -> float:
        """A leader that has not renewed for this long stops acting: a standby may claim
        `duration_s` after the last renewal it saw, and it saw none later than the renewal began,
        so the leader has stopped by then."""
        return self.duration_s - self.renew_s


@attrs.frozen
class Watched:
    """What a standby has seen of the lease, and since when (its own monotonic clock)."""

    lease: Lease | None
    since: float


def _moves(lease: Lease | None) -> tuple[int, int, str, bool] | None:
    """What changes when the lease is claimed, renewed or released."""
    if lease is None:
        return None
    return (lease.epoch, lease.renewals, lease.holder, lease.released)


def watch(before: Watched | None, lease: Lease | None, now: float) -> Watched:
    """Fold a fresh read of the lease into what a standby has seen."""
    if before is not None and _moves(before.lease) == _moves(lease):
        return before
    return Watched(lease, now)


def claim_at(seen: Watched, me: str) -> float:
    """When a standby (`me`) may claim the lease it has watched: at once if there is none, it was
    released or it is its own (an earlier run on the same state dir, which is gone: the state
    dir's lock says so), else once it has not moved for its duration."""
    lease = seen.lease
    if lease is None or lease.released or lease.holder == me:
        return -math.inf
    return seen.since + lease.duration_s


def claimed(
    seen: Lease | None,
    *,
    holder: str,
    duration_s: float,
    pid: int,
    wall: float,
    address: str | None = None,
    floor: int = 0,
) -> Lease:
    """The lease a claim over `seen` stores: the next epoch, and above `floor` (the highest
    epoch a replica has said it was commanded by: a store put back from a backup may hold a
    lower one than the replicas have seen). ``StoreError`` past the epochs' limit."""
    epoch = max(seen.epoch if seen is not None else 0, floor) + 1
    if epoch >= MAX_COUNT:
        raise StoreError(f"the lease's next epoch ({epoch}) is past the limit of 2**62")
    return Lease(
        epoch=epoch,
        holder=holder,
        duration_s=duration_s,
        address=address,
        pid=pid,
        acquired_at=wall,
        renewed_at=wall,
    )


def renewed(lease: Lease, *, wall: float, address: str | None, released: bool = False) -> Lease:
    """The lease a renewal stores (or, `released`, a release: given up on purpose)."""
    return attrs.evolve(
        lease, renewals=lease.renewals + 1, renewed_at=wall, address=address, released=released
    )


def same_grant(a: Lease | None, b: Lease | None) -> bool:
    """Whether two reads show the lease in the same state (a claim's compare)."""
    return _moves(a) == _moves(b)
