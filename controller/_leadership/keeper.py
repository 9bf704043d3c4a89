"""Leadership, the trio part: stand by until the lease is ours, then keep it, and stop leading
the moment it is lost (``_model.decisions.lease`` holds the decisions, ``fencing`` the refusals).

A leader runs inside ``leading_scope()``, cancelled when the lease is lost: when a renewal is
refused (another daemon claimed; the store and the replicas then refuse its writes and commands
too), or when no renewal has come back by the renew deadline (the last renewal that succeeded
plus ``duration_s - renew_s``: a hung or failing store), and at once when the store or a
replica refuses one of its commands. Its replicas are left as they are, as after a crash.

The decision is the renewal's own, not a timer's on a loop that may be busy: when the loop
stalls past the renew deadline (a long collection, a burst of work), the leader renews as soon
as it runs again, and goes on leading if the renewal, a compare-and-set, finds the lease still
its own: no standby claimed it meanwhile, so none acts. If one did, the renewal is refused and
the leader stops; what it did in between was refused as well, since the store takes intent and
the replicas take commands only from the epoch the lease holds (fencing).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import final

import trio

from .._clock import wall_now
from .._model.decisions.lease import Lease, LeaseTiming, Watched, claim_at, claimed, renewed, watch
from .._model.values.errors import FencedError, StoreError
from .._ports.store import LeaseStore, Retirable

logger = logging.getLogger("controller.leadership")


@final
class Leadership:
    """The lease of `store`, as `holder` (a daemon's host and state dir) campaigns for it and
    keeps it. `address` is this daemon's API, put in the lease for standbys to send writes to.

    Counters for metrics: `renewals`, `renew_failures`, `transitions` (times it started or
    stopped leading), `refusals`."""

    def __init__(
        self, store: LeaseStore, holder: str, timing: LeaseTiming, *, address: str | None = None
    ):
        self.store = store
        self.holder = holder
        self.timing = timing
        self.address = address
        self.seen: Lease | None = None
        """The lease as last read or written: who leads."""
        self.held: Lease | None = None
        """Ours, while this daemon leads."""
        self.leading_since: float | None = None
        """When this daemon last began to lead, by the wall clock."""
        self.renewals = 0
        self.renew_failures = 0
        self.transitions = 0
        self.refusals = 0
        """How many of this daemon's commands the store or a replica refused as stale."""
        self.floor = 0
        """The highest epoch a refusal named: the next claim goes above it."""
        self.how = ""
        """How this daemon came to lead, for the log: who led before, and why it no longer does."""
        self._scope: trio.CancelScope | None = None
        self._store_down = False

    @property
    def leading(self) -> bool:
        return self.held is not None

    async def campaign(self, on_read: Callable[[], Awaitable[None]] | None = None) -> Lease:
        """Stand by until the lease is ours; return it. `on_read` runs after each read of the
        lease while standing by (a standby refreshes its view of the store then)."""
        seen: Watched | None = None
        while True:
            try:
                lease = await self.store.read_lease()
            except StoreError as exc:
                self._store_failed("reading the lease", exc)
                await trio.sleep(self.timing.renew_s)
                continue
            self.seen = lease
            now = trio.current_time()
            seen = watch(seen, lease, now)
            if now >= claim_at(seen, self.holder):
                try:
                    new = claimed(
                        lease,
                        holder=self.holder,
                        duration_s=self.timing.duration_s,
                        pid=os.getpid(),
                        wall=wall_now(),
                        address=self.address,
                        floor=self.floor,
                    )
                    won = await self.store.claim_lease(lease, new)
                except StoreError as exc:
                    self._store_failed("claiming the lease", exc)
                    await trio.sleep(self.timing.renew_s)
                    continue
                # Back only once a write went through too: a store that reads but cannot
                # write (a full disk) would otherwise be logged as down and back twice a period.
                self._store_back()
                if won:
                    self._began(new, lease)
                    return new
                continue  # another claimed or renewed it meanwhile: read it again at once
            self._store_back()
            if on_read is not None:
                await on_read()
            await trio.sleep_until(min(claim_at(seen, self.holder), now + self.timing.renew_s))

    def _began(self, lease: Lease, before: Lease | None) -> None:
        self.held = self.seen = lease
        self.leading_since = lease.acquired_at
        self.transitions += 1
        if before is None:
            how = "no daemon led before"
        elif before.released:
            how = f"epoch {before.epoch} was released"
        elif before.holder == self.holder and self.transitions > 1:
            how = f"epoch {before.epoch} was this daemon's, and no other claimed it meanwhile"
        elif before.holder == self.holder:
            how = f"epoch {before.epoch} was this state dir's, from an earlier run"
        else:
            how = (
                f"epoch {before.epoch} ({before.holder}, pid {before.pid}) was not renewed for "
                f"{before.duration_s:g}s"
            )
        self.how = how

    @contextmanager
    def leading_scope(self) -> Iterator[trio.CancelScope]:
        """The scope a leader acts in: cancelled when the lease is lost (``keep`` decides)."""
        assert self.held is not None, "campaign() first"
        with trio.CancelScope() as scope:
            self._scope = scope
            try:
                yield scope
            finally:
                self._scope = None
                if scope.cancelled_caught or scope.cancel_called:
                    self._ended()

    def fenced(self, exc: FencedError) -> None:
        """The store or a replica refused this leader's epoch: stop acting now."""
        self.refusals += 1
        if exc.newer is not None:
            self.floor = max(self.floor, exc.newer)
        if self._scope is not None and not self._scope.cancel_called:
            logger.warning("fenced: %s", exc)
            self._scope.cancel()

    async def keep(self) -> None:
        """Renew the lease every period, while leading. Returns once the lease is lost (the
        leading scope is then cancelled): a renewal refused, or none come back by the renew
        deadline. A renewal late because the loop was busy is tried as soon as it runs, and
        counts if the store takes it."""
        scope = self._scope
        assert scope is not None, "keep() runs inside leading_scope()"
        timing = self.timing
        # A standby may claim `duration_s` after the last renewal it saw, which it cannot have
        # seen before that renewal began: `renewed_from` is when the last one that worked began.
        renewed_from = began = trio.current_time()
        next_at = began + timing.renew_s
        while True:
            await trio.sleep_until(next_at)
            began = trio.current_time()
            next_at = began + timing.renew_s
            lease = self.held
            if lease is None:
                return  # released
            new = renewed(lease, wall=wall_now(), address=self.address)
            renewed_now = False
            # A store that does not answer gets until the renew deadline (and at least a renew
            # period, should the loop have been held up past it).
            bound = max(renewed_from + timing.renew_deadline_s, began + timing.renew_s)
            with trio.move_on_at(bound) as attempt:
                try:
                    await self.store.renew_lease(new)
                    renewed_now = True
                except FencedError as exc:
                    self.fenced(exc)
                    return
                except StoreError as exc:
                    self.renew_failures += 1
                    self._store_failed("renewing the lease", exc)
            if renewed_now:
                self._store_back()
                self.renewals += 1
                self.held = self.seen = new
                late = began - (renewed_from + timing.renew_s)
                if late > timing.renew_s:
                    logger.warning(
                        "renewed the lease %.2fs late (the daemon's loop was held up); still "
                        "leading as epoch %d",
                        late,
                        new.epoch,
                    )
                renewed_from = began
                continue
            now = trio.current_time()
            if attempt.cancelled_caught and now - bound > timing.renew_s / 2:
                # Its time ran out while the loop was held up, not while the store was asked:
                # the store may well have answered. Ask again at once.
                next_at = now
                continue
            if now >= renewed_from + timing.renew_deadline_s:
                self.renew_failures += 1
                logger.warning(
                    "the lease was not renewed for %.2fs (the store is slow or failing)",
                    now - renewed_from,
                )
                scope.cancel()
                return

    def _ended(self) -> None:
        lease = self.held
        self.held = None
        self.leading_since = None
        self.transitions += 1
        if lease is not None:
            logger.warning("stopped leading (epoch %d); standing by", lease.epoch)

    async def release(self) -> Lease | None:
        """Give the lease up (a clean stop), so that a standby takes over at once; the lease
        as released (None if none was held, or it could not be released: a lease lost already
        is left as it is, and one the store refused lapses on its own)."""
        lease = self.held
        if lease is None:
            return None
        self.held = None
        given_up = renewed(lease, wall=wall_now(), address=None, released=True)
        try:
            await self.store.renew_lease(given_up)
        except (FencedError, StoreError) as exc:
            logger.debug("the lease was not released (%s); it lapses on its own", exc)
            return None
        # Quiet: a failed start releases too, and says why in its one line.
        logger.debug("released the lease (epoch %d)", lease.epoch)
        return given_up

    async def retire_if_alone(self, released: Lease) -> bool:
        """After a shutdown that `released` the lease: once standbys have had the time to read
        it twice, if none has claimed it (no daemon uses the store), remove what the store runs
        beside its data (``Retirable``: Ray's fencing actor). Says whether it did."""
        if not isinstance(self.store, Retirable):
            return False
        await trio.sleep(self.timing.renew_s * 2)  # a standby reads the lease that often
        now = await self.store.read_lease()
        if now is not None and (now.epoch != released.epoch or not now.released):
            return False  # a standby leads now: it uses the store
        await self.store.retire()
        logger.info("no daemon uses the store now: its fencing actor is removed")
        return True

    def _store_failed(self, doing: str, exc: StoreError) -> None:
        if not self._store_down:
            self._store_down = True
            logger.error("%s: %s; trying again every %gs", doing, exc, self.timing.renew_s)

    def _store_back(self) -> None:
        if self._store_down:
            self._store_down = False
            logger.info("the store answers again")


def holder_name(host: str, state_dir: str) -> str:
    """A daemon's name in the lease: the same for a restart on the same state dir."""
    return f"{host}:{state_dir}"
