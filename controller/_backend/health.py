"""When each serving replica's next health check is due: one heap per backend, read lazily.

A check is scheduled when the last one starts, not when it returns, so a check that hangs is
noticed one period later ("late") instead of only at its own timeout: a replica that stops
answering leaves the watch snapshot within a period.

Due times are put on a grid (a tenth of the period, at most a second): replicas started apart
are then checked together, each group in one wave, after one timer and before one pass, instead
of each check costing the controller a wake-up, a timer, a wave and a pass of its own (what a
check costs at rest is mostly those, on real workers). A replica's checks stay one period apart;
its first is up to half a step early or late. Each backend's grid is shifted by a phase of its
own (from its name), so that the backends' waves do not all come at one instant: a burst of
every replica's checks at once would hold up the loop's other work, and keep thousands of tasks
alive together.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import final

import trio

from .._model.config import BackendConfig
from .._model.pass_plan import DueCheck, HealthState, PassPlan
from .._model.status import ReplicaState
from .replica import Replica
from .tasks import Launcher

#: The longest step of the grid checks are due on.
GRID_MAX_S = 1.0


def on_grid(at: float, period: float, phase: float = 0.0) -> float:
    """`at`, moved to the nearest step of the grid of checks every `period`, shifted by `phase`
    (a fraction of a step, in [0, 1); see above)."""
    step = min(period / 10, GRID_MAX_S)
    shift = phase * step
    return round((at - shift) / step) * step + shift


def grid_phase(name: str) -> float:
    """The phase of backend `name`'s grid: spread over [0, 1), the same in every controller."""
    return zlib.crc32(name.encode()) / 2**32


@final
class HealthSchedule:
    """Due times of health checks: (time, seq, tag) entries, each checked against its replica
    when it comes up, so that a replica that left or was rescheduled needs no removal."""

    def __init__(self, phase: float = 0.0) -> None:
        self._due: list[tuple[float, int, str]] = []
        self._phase = phase

    def schedule(self, replica: Replica, now: float, period: float) -> None:
        """The replica's next check is one `period` from `now` (none if the period is 0)."""
        if period <= 0:
            replica.next_check_at = math.inf
            return
        replica.next_check_at = on_grid(now + period, period, self._phase)
        heapq.heappush(self._due, (replica.next_check_at, replica.seq, replica.tag))

    def clear(self) -> None:
        self._due.clear()

    @property
    def next_at(self) -> float:
        """When the earliest entry is due (inf if none)."""
        return self._due[0][0] if self._due else math.inf

    def take_due(self, now: float, replicas: Mapping[str, Replica]) -> Iterator[Replica]:
        """The RUNNING replicas whose check is due at `now`; each entry is taken once."""
        while self._due and self._due[0][0] <= now:
            at, _, tag = heapq.heappop(self._due)
            replica = replicas.get(tag)
            if (
                replica is not None
                and replica.next_check_at == at
                and replica.state is ReplicaState.RUNNING
            ):
                yield replica


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
        *,
        phase: float = 0.0,
    ):
        self.schedule = HealthSchedule(phase)
        self._launcher = launcher
        self._failed = failed
        self._ready_changed = ready_changed
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
        """A new period (or checks turned on or off): it applies to the replicas running now."""
        self.schedule.clear()
        for replica in replicas.values():
            if replica.state is ReplicaState.RUNNING:
                self.schedule.schedule(replica, now, period)

    def read(self, now: float, replicas: Mapping[str, Replica], *, take: bool) -> HealthState:
        """What a pass decides on; the checks due are taken off the schedule if `take`."""
        due = (
            tuple(
                DueCheck(r.tag, r.checking, r.check_failures, r.version, r.ready_at)
                for r in self.schedule.take_due(now, replicas)
            )
            if take
            else ()
        )
        return HealthState(due, self.schedule.next_at, self._adoptions_due)

    def carry_out(
        self, plan: PassPlan, now: float, replicas: Mapping[str, Replica], config: BackendConfig
    ) -> None:
        """The pass's health checks: late ones fail, due ones start, in one wave."""
        if plan.adoptions_late:
            self._adoptions_due = math.inf
            for replica in replicas.values():
                if replica.state is ReplicaState.RECOVERING and replica.served and replica.healthy:
                    replica.healthy = False  # back in once adopted (RUNNING and ready)
                    self._ready_changed()
        if plan.checks_off:
            self.schedule.clear()  # turned off by a redeploy: drop what the old spec scheduled
            return
        period = config.health_check_period_s
        # The next check is due one period on, whatever this one does: a check still in flight
        # then is late, and counts as failed.
        for tag in plan.late:
            self.schedule.schedule(replicas[tag], now, period)
            self._fail(replicas[tag], plan.late_reason)
        for tag in plan.checks:
            self.schedule.schedule(replicas[tag], now, period)
            replicas[tag].checking = True
        if plan.checks:
            self._launcher.checks(list(plan.checks), config.health_check_timeout_s)

    def reported(self, replica: Replica, error: str | None) -> None:
        """A check of `replica` returned (failed if `error`)."""
        replica.checking = False
        if replica.state is not ReplicaState.RUNNING:
            return  # stopping, or being reconfigured (checked again once RUNNING)
        if error is not None:
            self._fail(replica, error)
            return
        replica.check_failures = 0
        if not replica.healthy:
            replica.healthy = True
            self._ready_changed()  # ready again: back in the watch snapshot

    def _fail(self, replica: Replica, error: str) -> None:
        replica.check_failures += 1
        if replica.healthy:
            replica.healthy = False
            self._ready_changed()
        self._failed(replica, error)
