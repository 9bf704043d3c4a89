"""What one pass of a backend's loop does, decided at once: ``decide_pass(state, now)``.

The loop applies its events (``_backend/reduce.py``), reads what the pass needs into a frozen
``PassState``, asks ``decide_pass`` for a ``PassPlan`` and carries it out through its helpers,
which keep their state and their writes. The plan says whether the rollout fails on its deadline
or completes, which replicas to start, stop and reconfigure (``reconcile.decide``), which health
checks start and which are late, and when to wake up next.

An autoscaled backend's count is decided just before, by ``decide_scale`` (pure): the
autoscaler's evaluation (``autoscale.evaluate``) and the capacity gate's count
(``gate.gate_count``), which the pass needs before it reads the health checks due (a pass on load
alone that keeps the count takes none). The backend's parts keep what it decided once the plan is
made (``Scaled``; the gate's question to the runtime is the executor's to ask). The backoff's end
is read once the plan is carried out (``PassPlan.wake``): a late check that reaches its threshold
backs off by a random delay that only carrying it out draws.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import attrs

from ..config.autoscaling import AutoscalingConfig
from ..records.replica_state import ReplicaState
from ..records.revisions import Revision, RevisionBook
from .autoscale import Inputs, ScaleDecision, ScaleState, evaluate
from .canary_plan import CanarySplit, decide_split
from .census import Census
from .failures import Blocked, blocks_starts, halts, unhealthy_after_ready
from .gate import Gate, gate_count
from .reconcile import Plan, ReplicaView, decide
from .spec import Spec


@attrs.frozen
class RolloutState:
    """The rollout of the spec's revision, as the pass finds it."""

    active: bool
    revision: int | None
    deadline: float
    """When it fails without progress (inf if not active)."""
    settled_at: float
    """When its newest replica has been ready for ``min_ready_s``."""


@attrs.frozen
class DueCheck:
    """A serving replica whose health check is due (taken off the schedule for this pass) while
    its last check has not answered yet: this one is late."""

    tag: str
    check_failures: int
    version: str
    ready_at: float


@attrs.frozen
class HealthState:
    due: tuple[str, ...]
    """The replicas whose check is due and whose last check answered, in the order they fell
    due (the commonest case by far: a tag is all a pass needs of them)."""
    late: tuple[DueCheck, ...]
    """Those whose check is due while their last one is still in flight, in order."""
    rest_at: float
    """When the earliest check left on the schedule is due (inf if none)."""
    adoptions_due: float
    """When adopted replicas that have not answered leave the watch snapshot."""


@attrs.frozen
class ScaleInput:
    """An autoscaled backend's count, as the pass finds it."""

    config: AutoscalingConfig
    state: ScaleState
    ongoing: float | None
    """The load now (ongoing requests; None: no signal)."""
    gate: Gate


@attrs.frozen
class Scaled:
    """What the pass decided of an autoscaled backend's count."""

    state: ScaleState
    decision: ScaleDecision
    wake: float | None
    """When the autoscaler wants to evaluate again (None: only on a new input)."""
    gate: Gate
    ask: int | None
    """A count to ask the runtime for room for (None: no question now)."""
    count: int | None
    """The count as far as it fits (None: `unchanged`, the last one holds)."""
    unchanged: bool
    """Only load was heard and the autoscaler kept its count: the replica plan is the last one."""

    @property
    def wake_at(self) -> float:
        """When the autoscaler or the capacity gate wants a pass."""
        return min(math.inf if self.wake is None else self.wake, self.gate.next_at)


def decide_scale(
    scale: ScaleInput, census: Census, version: str, load_only: bool, now: float
) -> Scaled:
    """The autoscaler's evaluation on the load now, and how far its count fits: replicas not
    serving yet count as fully loaded before it scales down (counted only then: it walks the
    census), and replicas stopping do not hold room."""
    config, before = scale.config, scale.state
    ongoing = scale.ongoing
    fewer = ongoing is not None and ongoing / config.target_ongoing_requests < before.target
    inputs = Inputs(ongoing, census.not_ready(version) if fewer else 0)
    after, decision, wake = evaluate(config, before, inputs, now)
    unchanged = load_only and not decision.changed
    if unchanged:
        return Scaled(after, decision, wake, scale.gate, None, None, unchanged=True)
    held = census.total - census.count(ReplicaState.STOPPING)
    count, gate, ask = gate_count(scale.gate, after.target, held, now)
    return Scaled(after, decision, wake, gate, ask, count, unchanged=False)


@attrs.frozen
class PassState:
    """What a pass reads. `replicas` and `census` are the live ones, read and not copied (a
    backend of 10,000 replicas is not copied each pass)."""

    spec: Spec
    config_digest: str
    hands_config: bool
    """A user config is handed to replicas (a reconfigure makes them UPDATING)."""
    blocked: Blocked | None
    backoff_until: float
    converged: bool
    """Whether the last pass converged."""
    rollout: RolloutState
    scaled: Scaled | None
    """An autoscaled backend's count, decided (``decide_scale``; None: not autoscaled, or
    being deleted)."""
    health: HealthState
    replicas: Collection[ReplicaView]
    census: Census
    evict: frozenset[str] = frozenset()
    """Nodes being drained (``reconcile.Target.evict``)."""
    evict_now: frozenset[str] = frozenset()
    split: CanarySplit | None = None
    """A canary release's split of the replicas (``canary_plan``), while it is judged."""
    canary_at: float = math.inf
    """When the canary's step wants a look."""


@attrs.frozen
class PassPlan:
    """What the pass does, in this order."""

    now: float
    deadline_failure: str | None
    """The rollout fails now on its deadline (the reason); first, as nothing else depends on it."""
    replicas: Plan | None
    """What to start, stop and reconfigure (None: the pass stops after the deadline and timer)."""
    num_replicas: int
    """The count the replica plan works toward."""
    converged: bool
    complete: bool
    """The rollout completes now (the newest replica has been ready for ``min_ready_s``)."""
    adoptions_late: bool
    """Adopted replicas that had served and have not answered leave the watch snapshot."""
    checks_off: bool
    """Health checks are off: the schedule is dropped."""
    late: tuple[str, ...]
    """Replicas whose check is late (failed), with `late_reason`; in order."""
    late_reason: str
    checks: tuple[str, ...]
    """Replicas whose check starts now."""
    rollout_active: bool
    """Whether the rollout is still under way once the plan is carried out."""
    reached: bool
    """The spec's goal is reached (converged, not deleting, the rollout not under way)."""
    forget: bool
    """A deleted backend has no replica left: it is forgotten."""
    wake_at: float
    """The next health check, autoscaler window or rollout deadline (the backoff apart)."""

    def wake(self, backoff_until: float) -> float:
        """When the loop wakes next: `wake_at`, or the backoff's end if that is sooner."""
        return min(self.wake_at, backoff_until) if backoff_until > self.now else self.wake_at


def rollback_target(book: RevisionBook, failed: int) -> Revision | str:
    """Where an automatic rollback of revision `failed` goes: the newest revision that
    completed with every replica serving, or why there is none. Never further back than that:
    if the newest good revision is what failed (a rollback that failed too, or a good release
    that fails now), the rollout halts rather than go to an older release."""
    revision = book.get(failed)
    if revision is not None and revision.automatic:
        return "the automatic rollback failed too"
    stable = None if revision is None else book.get(revision.canary_of)
    if stable is not None:
        return stable  # a canary goes back to what it was judged against
    target = book.last_good()
    if target is None:
        return "no earlier revision completed, so there is none to roll back to"
    if revision is not None and target.digest == revision.digest:
        return "the last good revision is what failed"
    return target


@attrs.frozen
class AfterFailure:
    """What a failed rollout does: halt where it is, or roll back to `roll_back_to`."""

    roll_back_to: int | None
    """The revision an automatic rollback goes to (None: the rollout halts)."""
    said: str
    """What follows, as the goal's error, the events and the revision's error say it."""


def after_failure(
    book: RevisionBook, failed: int, *, on_failure: str, in_canary: bool
) -> AfterFailure:
    """What the failure of revision `failed`'s rollout does: a canary goes back to the revision
    it was judged against; any other rollout halts, or rolls back with ``on_failure =
    "rollback"``; either halts where ``rollback_target`` finds nowhere to go."""
    if not in_canary and on_failure != "rollback":
        return AfterFailure(None, "the rollout is halted where it is (on_failure=halt)")
    target = rollback_target(book, failed)
    if isinstance(target, str):
        if in_canary:
            return AfterFailure(None, f"the canary is aborted; {target}: halted")
        return AfterFailure(None, f"{target}: halted")
    if in_canary:
        said = f"the canary is aborted: back to revision {target.number}, the stable one"
    else:
        said = f"rolling back to revision {target.number} (on_failure=rollback)"
    return AfterFailure(target.number, said)


def decide_pass(state: PassState, now: float) -> PassPlan:
    """The plan of one pass over `state` at `now` (trio time)."""
    spec, config, rollout = state.spec, state.spec.backend_config, state.rollout
    blocked, active = state.blocked, rollout.active
    failure = None
    if (
        active
        and not state.converged
        and not spec.deleting
        and blocked is None
        and now >= rollout.deadline
    ):
        failure = (
            f"ProgressDeadlineExceeded: no new replica of revision {rollout.revision} became "
            f"ready within progress_deadline_s={config.progress_deadline_s:g}"
        )
        blocked, active = "ProgressDeadlineExceeded", False
    health = state.health
    scaled = state.scaled
    if scaled is not None and scaled.unchanged:
        return _plan(
            state, now, failure, None, converged=state.converged, rollout_active=active,
            health_at=min(health.rest_at, health.adoptions_due),
        )  # fmt: skip
    target = spec.target(
        state.config_digest,
        blocked=blocks_starts(blocked),
        deferred=now < state.backoff_until,
        replicas=None if scaled is None else scaled.count,
        halted=halts(blocked),
        evict=state.evict,
        evict_now=state.evict_now,
    )
    split = state.split
    if split is None:
        replicas = decide(target, state.replicas, state.census)
    else:
        replicas = decide_split(target, split, state.replicas)
    # A count held back until the runtime says whether there is room is not the goal.
    converged = replicas.converged and not (scaled is not None and scaled.gate.pending)
    # A canary completes only once promoted and rolled out (its split gone).
    complete = (
        converged and active and not spec.deleting and now >= rollout.settled_at and split is None
    )
    active = active and not complete

    adoptions_late = now >= health.adoptions_due
    period = config.health_check_period_s
    # Stopped or reconfigured by this plan: no longer RUNNING, so not checked.
    left = set(replicas.stop)
    if state.hands_config:
        left.update(replicas.reconfigure)
    due = [t for t in health.due if t not in left] if period > 0 else []
    late = [d for d in health.late if d.tag not in left] if period > 0 else []
    for check in late:
        ready_at, of_spec = check.ready_at, check.version == spec.version
        if unhealthy_after_ready(active, blocked, of_spec, ready_at, config.min_ready_s, now):
            blocked, active = "UnhealthyAfterReady", False
    taken = due or late
    schedule_at = (
        min(health.rest_at, now + period if taken else math.inf) if period > 0 else math.inf
    )
    return _plan(
        state,
        now,
        failure,
        replicas,
        num_replicas=target.num_replicas,
        converged=converged,
        complete=complete,
        adoptions_late=adoptions_late,
        checks_off=period <= 0,
        late=tuple(d.tag for d in late),
        late_reason=f"HealthCheckLate: no answer within health_check_period_s={period:g}",
        checks=tuple(due),
        rollout_active=active,
        health_at=min(schedule_at, math.inf if adoptions_late else health.adoptions_due),
    )


def _plan(
    state: PassState,
    now: float,
    failure: str | None,
    replicas: Plan | None,
    *,
    converged: bool,
    rollout_active: bool,
    health_at: float,
    num_replicas: int = 0,
    complete: bool = False,
    adoptions_late: bool = False,
    checks_off: bool = False,
    late: tuple[str, ...] = (),
    late_reason: str = "",
    checks: tuple[str, ...] = (),
) -> PassPlan:
    rollout = state.rollout
    if not rollout_active:
        rollout_at = math.inf
    elif state.split is not None:
        rollout_at = math.inf if converged else rollout.deadline  # the canary's steps lead
    else:
        rollout_at = rollout.settled_at if converged else rollout.deadline
    done = replicas is not None and converged
    scaling_at = math.inf if state.scaled is None else state.scaled.wake_at
    return PassPlan(
        now=now,
        deadline_failure=failure,
        replicas=replicas,
        num_replicas=num_replicas,
        converged=converged,
        complete=complete,
        adoptions_late=adoptions_late,
        checks_off=checks_off,
        late=late,
        late_reason=late_reason,
        checks=checks,
        rollout_active=rollout_active,
        reached=done and not state.spec.deleting and not rollout_active,
        forget=done and state.spec.deleting,
        wake_at=min(health_at, scaling_at, rollout_at, state.canary_at),
    )
