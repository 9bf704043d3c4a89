"""When each serving replica's next health check is due: one heap per backend, read lazily.

A check is scheduled when the last one starts, not when it returns, so a check that hangs is
noticed one period later ("late") instead of only at its own timeout: a replica that stops
answering leaves the watch snapshot within a period.

When a check comes due, the backend's checks due within the next tenth of the period (at most a
second, `GATHER_MAX_S`) are taken with it, a little early: replicas started apart are then checked
together, each group in one wave, after one timer and before one pass, instead of each check
costing the controller a wake-up, a timer, a wave and a pass of its own (what a check costs at
rest is mostly those, on real workers). Each replica keeps its own cadence (a check taken early
schedules the next one a period after the time it was due), so the same groups form again each
period; and backends started apart keep their waves apart.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from typing import Protocol, final

import trio

from .._model.config.config import BackendConfig
from .._model.decisions.pass_plan import DueCheck, HealthState, PassPlan
from .._model.records.replica_state import ReplicaState
from .replica import Replica
from .tasks import Launcher

#: The most a check is taken early to go with the one due first (see above).
GATHER_MAX_S = 1.0


@final
class HealthSchedule:
    """Due times of health checks: (time, seq, tag) entries, each checked against its replica
    when it comes up, so that a replica that left or was rescheduled needs no removal."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, str]] = []
        self._gather = 0.0

    def schedule(self, replica: Replica, now: float, period: float) -> None:
        """The replica's next check is one `period` from `now` (none if the period is 0)."""
        if period <= 0:
            replica.checks.next_at = math.inf
            return
        self._gather = min(period / 10, GATHER_MAX_S)
        replica.checks.next_at = now + period
        heapq.heappush(self._due, (replica.checks.next_at, replica.seq, replica.tag))

    def clear(self) -> None:
        self._due.clear()

    @property
    def next_at(self) -> float:
        """When the earliest entry is due (inf if none)."""
        return self._due[0][0] if self._due else math.inf

    def take_due(self, now: float, replicas: Mapping[str, Replica]) -> list[Replica]:
        """The RUNNING replicas whose check is due at `now`, with those due soon after (see
        above); each entry is taken once."""
        due = self._due
        until = now + self._gather
        taken: list[Replica] = []
        while due and due[0][0] <= until:
            at, _, tag = heapq.heappop(due)
            replica = replicas.get(tag)
            if (
                replica is not None
                and replica.checks.next_at == at
                and replica.state is ReplicaState.RUNNING
            ):
                taken.append(replica)
        return taken

    def taken(self, replicas: list[Replica], now: float, period: float) -> None:
        """`replicas`' checks (or their lateness) were just taken: the next of each is one
        `period` (above 0) from when it was due, if that is later than `now` (taken early), else
        from `now`. A wave's loop: what a check costs at rest."""
        due = self._due
        self._gather = min(period / 10, GATHER_MAX_S)
        for replica in replicas:
            at = replica.checks.next_at
            replica.checks.next_at = (at if now < at < math.inf else now) + period
            heapq.heappush(due, (replica.checks.next_at, replica.seq, replica.tag))


class Mark(Protocol):
    """How the health part has a replica marked healthy or not: by its set, which writes every
    field of a replica (``ReplicaSet.mark``)."""

    def __call__(self, replica: Replica, *, healthy: bool) -> None: ...


@final
class HealthChecks:
    """The health checks of a backend's serving replicas, and what their outcomes do to each
    replica's readiness. A failed or late check takes a replica out of the watch snapshot at once
    (not ready; `ready_changed` is called); `failed` is told of each such check, with the count
    in a row, for the loop to decide on a replacement (not live)."""

    def __init__(
        self,
        launcher: Launcher,
        failed: Callable[[Replica, str], None],
        ready_changed: Callable[[], None],
        late: Callable[[int], None],
        mark: Mark,
    ):
        self.schedule = HealthSchedule()
        self._launcher = launcher
        self._failed = failed
        self._late = late
        self._ready_changed = ready_changed
        self._mark = mark  # a replica's health is its set's to write (``ReplicaSet.mark``)
        self._adoptions_due = math.inf

    @property
    def next_at(self) -> float:
        """When a pass has something to do next (inf: never, unless told of more)."""
        return min(self.schedule.next_at, self._adoptions_due)

    def adopting(self, replicas: Mapping[str, Replica], config: BackendConfig) -> None:
        """After a restart: the replicas being adopted that had served are listed to watchers
        (they may be serving still); those whose adoption has not answered within a period
        leave the snapshot then, like a replica whose check is late."""
        period = config.health_check_period_s
        if period > 0 and any(r.served for r in replicas.values()):
            self._adoptions_due = trio.current_time() + period

    def begin(self, replica: Replica, config: BackendConfig) -> None:
        """`replica` is RUNNING (again): its first check is one period from now."""
        self.schedule.schedule(replica, trio.current_time(), config.health_check_period_s)

    def reschedule(self, replicas: Mapping[str, Replica], now: float, period: float) -> None:
        """A new period (or checks turned on or off): it applies to the replicas running now.
        Turned off, no check is waited for, and no failed one keeps a replica out of the watch
        snapshot: nothing would ever bring it back."""
        self.schedule.clear()
        back = False
        for replica in replicas.values():
            if replica.state is not ReplicaState.RUNNING:
                continue
            self.schedule.schedule(replica, now, period)
            if period <= 0:
                replica.checks.in_flight = replica.checks.late = False
                replica.checks.failures = 0
                if not replica.healthy:
                    self._mark(replica, healthy=True)
                    back = True
        if back:
            self._ready_changed()

    def read(self, now: float, replicas: Mapping[str, Replica], *, take: bool) -> HealthState:
        """What a pass decides on; the checks due are taken off the schedule if `take`."""
        due: list[str] = []
        late: list[DueCheck] = []
        if take:
            for r in self.schedule.take_due(now, replicas):
                if r.checks.in_flight:
                    late.append(DueCheck(r.tag, r.checks.failures, r.version, r.ready_at))
                else:
                    due.append(r.tag)
        return HealthState(tuple(due), tuple(late), self.schedule.next_at, self._adoptions_due)

    def carry_out(
        self, plan: PassPlan, now: float, replicas: Mapping[str, Replica], config: BackendConfig
    ) -> None:
        """The pass's health checks: late ones fail, due ones start, in one wave."""
        if plan.adoptions_late:
            self._adoptions_due = math.inf
            for replica in replicas.values():
                if replica.state is ReplicaState.RECOVERING and replica.served and replica.healthy:
                    self._mark(replica, healthy=False)  # back in once adopted, RUNNING and ready
                    self._ready_changed()
        if plan.checks_off:
            self.schedule.clear()  # turned off by a redeploy: drop what the old spec scheduled
            return
        period = config.health_check_period_s
        # The next check is due one period on, whatever this one does: a check still in flight
        # then is late, and counts as failed.
        late = [replicas[tag] for tag in plan.late]
        self.schedule.taken(late, now, period)
        if late:
            self._late(len(late))
        for replica in late:
            replica.checks.late = True
            self._fail(replica, plan.late_reason)
        if plan.checks:
            checked = [replicas[tag] for tag in plan.checks]
            self.schedule.taken(checked, now, period)
            for replica in checked:
                replica.checks.in_flight = True
            self._launcher.checks(list(plan.checks), config.health_check_timeout_s)

    def reported(self, replica: Replica, error: str | None) -> bool:
        """A check of `replica` returned (failed if `error`); False if that changes nothing but
        the check's being in flight (it passed, and the replica was healthy and serving; or it
        passed after it had been counted late; or it was no longer waited for)."""
        if not replica.checks.in_flight:
            return False  # checks were turned off meanwhile
        replica.checks.in_flight = False
        if replica.checks.late:
            replica.checks.late = False
            if error is None:
                return False  # counted failed when it was late: passing now undoes nothing
        if replica.state is not ReplicaState.RUNNING:
            return True  # stopping, or being reconfigured (checked again once RUNNING)
        if error is not None:
            self._fail(replica, error)
            return True
        if replica.checks.failures == 0 and replica.healthy:
            return False
        replica.checks.failures = 0
        if not replica.healthy:
            self._mark(replica, healthy=True)
            self._ready_changed()  # ready again: back in the watch snapshot
        return True

    def _fail(self, replica: Replica, error: str) -> None:
        replica.checks.failures += 1
        if replica.healthy:
            self._mark(replica, healthy=False)
            self._ready_changed()
        self._failed(replica, error)
