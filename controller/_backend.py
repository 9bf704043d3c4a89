"""One backend: its task, its nursery, its replicas and its reconcile loop.

The loop is the only writer of the backend's replica state. Every start, adoption, reconfigure,
drain and kill runs as a task in the backend's nursery and reports by sending an event on the
backend's channel; the loop wakes on that channel, applies every queued event, asks the pure
``decide`` for a plan, publishes the watch snapshot, and acts. A writer task checkpoints the
backend's replica record; every runtime action waits until the intent behind it is durable, but
the loop itself never waits on storage.
"""

from __future__ import annotations

import heapq
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Literal, final

import attrs
import trio

from . import _events as ev
from ._checkpoint import (
    EventsRecord,
    ReplicaRecord,
    ReplicasRecord,
    SpecRecord,
    dump_replica,
    events_key,
    join_replicas,
    replicas_key,
    spec_key,
)
from ._config import BackendConfig, ReplicaConfig
from ._describe import describe
from ._errors import ReplicaError, StoreError
from ._goal import Goal
from ._history import EventLog, plural
from ._json import JSON, digest
from ._observe import Observer
from ._policy import RestartPolicy
from ._reconcile import Target, decide, resolve_limits
from ._runtime import ReplicaInfo, ReplicaSpec, Runtime
from ._state import (
    SERVING_STATES,
    BackendReason,
    BackendSnapshot,
    BackendState,
    BackendStatus,
    ReplicaState,
    ReplicaStatus,
    ServingReplica,
)
from ._store import Store
from ._watch import SnapshotHub

logger = logging.getLogger("controller")

_tag_rng = random.SystemRandom()

#: How long a kill may take before the controller gives up on it (and logs it). Kills are shielded
#: from cancellation, so this bound is what keeps a stuck runtime from hanging a shutdown.
KILL_TIMEOUT_S = 30.0

#: The longest wait between retries of a failed checkpoint write.
WRITE_RETRY_MAX_S = 5.0


@attrs.frozen
class Spec:
    """A backend's spec in memory: the stored record plus what is derived from it."""

    generation: int
    backend_config: BackendConfig
    replica_config: ReplicaConfig
    deleting: bool
    force: bool
    version: str
    """The code version replicas must have (``gen-N`` when the config names none)."""
    config_digest: str

    @classmethod
    def from_record(cls, record: SpecRecord) -> Spec:
        config = record.backend_config
        return cls(
            generation=record.generation,
            backend_config=config,
            replica_config=record.replica_config,
            deleting=record.deleting,
            force=record.force,
            version=config.version if config.version is not None else f"gen-{record.generation}",
            config_digest=digest(config.user_config),
        )


@final
@attrs.define(eq=False)
class Replica:
    """One replica as the loop tracks it. Slotted and small: a controller may hold 10,000s."""

    tag: str
    version: str
    config_digest: str
    state: ReplicaState
    seq: int
    address: str | None = None
    pid: int | None = None
    node: str | None = None
    created_at: float | None = None
    """When it was asked for, by the wall clock (None if a schema-1 checkpoint did not say)."""
    graceful: bool = True
    """When stopping: drain before the kill (False for forced deletes and dead replicas)."""
    drain_scope: trio.CancelScope | None = None
    """Once stopping: cancelled to cut its drain short (a forced delete that comes meanwhile)."""
    scope: trio.CancelScope | None = None
    """The scope of its in-flight start, adoption or reconfigure, so that a stop can cancel it."""
    view: ServingReplica | None = None
    """Its entry in watch snapshots, made once when it starts serving."""
    record_json: str | None = None
    """Its entry in the checkpoint, cached; reset whenever what is stored of it changes."""
    healthy: bool = True
    """False while its latest health check failed."""
    check_failures: int = 0
    """Consecutive failed health checks."""
    next_check_at: float = math.inf
    """When its next health check is due (inf: none scheduled)."""
    checking: bool = False
    """A health check is in flight (never more than one)."""


@final
class Backend:
    """A backend's state and its task. Created by the controller; ``run`` is the task."""

    def __init__(
        self,
        name: str,
        spec: Spec,
        *,
        runtime: Runtime,
        store: Store,
        hub: SnapshotHub,
        lock: trio.Lock,
        on_forgotten: Callable[[Backend], None],
        policy: RestartPolicy,
        rng: random.Random,
        observer: Observer,
    ):
        self.name = name
        self.spec = spec
        self.lock = lock
        """Held by deploy and delete while they write the spec, and by the loop while it forgets
        a deleted backend, so that a deploy racing a finished delete is never lost."""
        self.replicas: dict[str, Replica] = {}
        self.goal = Goal(name, spec.generation, "delete" if spec.deleting else "deploy")
        self.last_error: str | None = None
        self.last_traceback: str | None = None
        # The last failure of this generation: what the message shows (a new deploy starts
        # with a clean slate there, while `last_error` keeps the latest failure of any).
        self._generation_error: str | None = None
        self.forgotten = False
        self._runtime = runtime
        self._store = store
        self._hub = hub
        self._on_forgotten = on_forgotten
        # Unbounded, and that is safe: every event answers a task the loop itself started (one
        # each), a death (at most one per replica) or a spec change (coalesced). Senders must never
        # block, because some of them run in the runtime's own callbacks.
        self._send, self._receive = trio.open_memory_channel[ev.Event](math.inf)
        self._nursery: trio.Nursery | None = None
        self._seq = 0
        self._policy = policy
        self._rng = rng
        self._observer = observer
        self._failures = 0  # failed starts of the target version since one was last ready
        self._failed_starts = 0  # in this generation, for the status message
        self._starts_blocked = False
        self._blocked_reason: BackendReason = "StartFailures"
        self._restarts = 0  # consecutive failures, for the backoff
        self._last_failure_at = -math.inf
        self._backoff_until = -math.inf
        # One timer task per backend, armed for the earliest of: the next health check due (a
        # heap of (due time, seq, tag), checked lazily against the replica) and the backoff end.
        self._health_due: list[tuple[float, int, str]] = []
        self._timer_at = math.inf
        self._timer_scope: trio.CancelScope | None = None
        self._change: tuple[BackendState, BackendReason] = (
            (BackendState.DELETING, "Deleting")
            if spec.deleting
            else (BackendState.UPSCALING, "ScaleUp")
        )
        self._observed_generation = 0
        self._converged = False
        self._snapshot_dirty = True
        # Checkpointing runs in its own task, so that the loop never waits on storage (and a
        # watcher never waits on an fsync). Each change of the stored record bumps
        # `_record_seq`; the writer reports `Written(seq)` once that state is durable; runtime
        # actions that depend on a change wait in `_queued` until then.
        self._record_seq = 0
        self._durable_seq = 0
        # What the writer last stored: the record as of this change number, and this many
        # events (so that a wake-up for one of the two does not rewrite the other).
        self._stored_seq = 0
        self._events_stored = 0
        self._write_wanted = trio.Event()
        self._queued: list[tuple[int, Callable[[], object]]] = []
        self.history = EventLog(name)
        self._event(
            "Delete" if spec.deleting else "Deploy",
            f"generation {spec.generation}: "
            f"{plural(spec.backend_config.num_replicas, 'replica')} of version {spec.version}",
        )

    # -- called by the controller (same trio thread; never concurrently with the loop's logic) --

    def set_spec(self, spec: Spec, kind: Literal["deploy", "delete"]) -> Goal:
        """Take a spec that is already durable; supersede the pending goal; wake the loop."""
        self.goal.supersede()
        old, self.spec = self.spec, spec
        self.goal = Goal(self.name, spec.generation, kind)
        # A new spec is a new attempt: the failure count, the failed state and the backoff of
        # the one it replaces do not carry over.
        self._failures = self._failed_starts = self._restarts = 0
        self._starts_blocked = False
        self._generation_error = None
        self._backoff_until = -math.inf
        self._change = _classify(old, spec)
        self._event("Delete" if spec.deleting else "Deploy", _describe_change(old, spec))
        if spec.force:
            # Forced: the drains under way are cut short, and the kills follow at once.
            for replica in self.replicas.values():
                if replica.state is ReplicaState.STOPPING and replica.graceful:
                    replica.graceful = False
                    if replica.drain_scope is not None:
                        replica.drain_scope.cancel()
        if spec.backend_config.health_check_period_s != old.backend_config.health_check_period_s:
            # A new period (or checks turned on or off) applies to the replicas already running.
            self._health_due.clear()
            for replica in self.replicas.values():
                if replica.state is ReplicaState.RUNNING and not replica.checking:
                    self._schedule_check(replica)
        self._snapshot_dirty = True
        self._send.send_nowait(ev.SpecChanged())
        return self.goal

    def matches(self, backend_config: BackendConfig, replica_config: ReplicaConfig) -> bool:
        """Whether a deploy of these configs would change nothing. It would after a failure:
        a deploy is what lifts DEPLOY_FAILED, even when the goal itself was reached before the
        replicas started failing."""
        return (
            not self.spec.deleting
            and self.goal.error is None
            and not self._starts_blocked
            and self.spec.backend_config == backend_config
            and self.spec.replica_config == replica_config
        )

    def restore(
        self, record: ReplicasRecord | None, live: set[str], events: EventsRecord | None
    ) -> list[str]:
        """Rebuild replicas from a checkpoint: adopt what is alive, forget what is not (and
        return those tags, for the runtime to clear what they left behind)."""
        dropped: list[str] = []
        for rec in record.replicas if record is not None else ():
            if rec.tag not in live:
                # Never started, or gone while the controller was down: the plan replaces it.
                dropped.append(rec.tag)
                continue
            state = ReplicaState.STOPPING if rec.stopping else ReplicaState.RECOVERING
            created = None if rec.created_ms is None else rec.created_ms / 1000
            replica = self._add(rec.tag, rec.version, rec.config_digest, state, created)
            replica.graceful = not self.spec.force
            if rec.stopping:
                replica.drain_scope = trio.CancelScope()
        # What was read back needs no write; only forgetting the dead does.
        self._record_seq = self._durable_seq = self._stored_seq = 0
        if not self.spec.deleting:
            self._change = (BackendState.UPDATING, "Recovering")
        self.history.restore(events)
        self._event(
            "Recovered",
            f"generation {self.spec.generation}: adopting "
            f"{plural(len(self.replicas), 'live replica')}",
        )
        if dropped:
            self._record_changed()
        return dropped

    def block_starts(self, reason: str) -> None:
        """Start nothing new until the next deploy, because the spec cannot be placed (found at
        recovery: a spec stored before the runtime shrank). Replicas already there stay."""
        self._starts_blocked = True
        self._blocked_reason = "Infeasible"
        self.last_error = self._generation_error = reason
        self.last_traceback = None
        logger.error("backend %s: %s", self.name, reason)
        self._event("Infeasible", reason)
        self.goal.fail(reason)

    def notify_died(self, tag: str, reason: str) -> None:
        self._send.send_nowait(ev.Died(tag, reason))

    def reserved(self) -> int:
        """How many replicas' worth of resources this backend holds or is about to. One that
        starts nothing until the next deploy (DEPLOY_FAILED) reserves only what it holds: it
        must not crowd out the others; its next deploy is checked afresh."""
        idle = self.spec.deleting or self._starts_blocked
        target = 0 if idle else self.spec.backend_config.num_replicas
        return max(target, len(self.replicas))

    # -- the task --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._writer)
            # What a previous controller left in flight; its intent is already stored.
            for replica in self.replicas.values():
                if replica.state is ReplicaState.RECOVERING:
                    self._spawn_bring_up(replica, adopt=True)
                elif replica.state is ReplicaState.STOPPING:
                    self._spawn_stop(replica)
            task_status.started()
            if not await self._reconcile():
                async for event in self._receive:
                    taken_at = trio.current_time()
                    self._apply(event)
                    handled = 1
                    # Coalesce a burst: one pass for everything already queued.
                    while True:
                        try:
                            event = self._receive.receive_nowait()
                        except trio.WouldBlock:
                            break
                        self._apply(event)
                        handled += 1
                    done = await self._reconcile()
                    self._observer.events_handled(
                        self.name, handled, trio.current_time() - taken_at
                    )
                    if done:
                        break
            # Forgotten: no replica is left, so the only task still here is the idle writer.
            nursery.cancel_scope.cancel()

    async def _writer(self) -> None:
        while True:
            await self._write_wanted.wait()
            self._write_wanted = trio.Event()
            # The text and its sequence number are taken together, with no checkpoint between:
            # the text holds every change up to `seq`.
            seq, events = self._record_seq, self.history.added
            changes = self._checkpoint()
            delay = 0.1
            while changes:
                try:
                    await self._store.write(changes)
                    break
                except StoreError as exc:
                    # Nothing that depends on this write happens until it lands, so retrying
                    # is safe; a newer text, if the record changed meanwhile, supersedes it.
                    logger.error(
                        "backend %s: checkpoint failed (%s); retry in %gs", self.name, exc, delay
                    )
                    await trio.sleep(delay)
                    delay = min(delay * 2, WRITE_RETRY_MAX_S)
                    seq, events = self._record_seq, self.history.added
                    changes = self._checkpoint()
            self._stored_seq, self._events_stored = seq, events
            self._send.send_nowait(ev.Written(seq))

    def _checkpoint(self) -> dict[str, str | None]:
        """What the writer stores: the replica record if it changed, and the events if they
        did, in one batch."""
        changes: dict[str, str | None] = {}
        if self._record_seq != self._stored_seq:
            changes[replicas_key(self.name)] = self._record_text()
        if self.history.added != self._events_stored:
            changes[events_key(self.name)] = self.history.text()
        return changes

    def _record_changed(self) -> None:
        self._record_seq += 1
        self._write_wanted.set()

    def _act(self, action: Callable[[], object]) -> None:
        """Do `action` (ask the runtime for something) once the intent behind it is durable."""
        if self._durable_seq >= self._record_seq:
            action()
        else:
            self._queued.append((self._record_seq, action))

    def _apply(self, event: ev.Event) -> None:
        if isinstance(event, ev.SpecChanged):
            return
        if isinstance(event, ev.Tick):
            if event.at == self._timer_at:  # not a stale tick of a timer since replaced
                self._timer_at, self._timer_scope = math.inf, None
            return
        if isinstance(event, ev.Written):
            self._durable_seq = max(self._durable_seq, event.seq)
            ready = [action for seq, action in self._queued if seq <= self._durable_seq]
            self._queued = [(seq, a) for seq, a in self._queued if seq > self._durable_seq]
            for action in ready:
                action()
            return
        replica = self.replicas.get(event.tag)
        if replica is None:
            return  # a late report about a replica already forgotten
        if isinstance(event, ev.Started):
            replica.scope = None
            if replica.state is ReplicaState.STOPPING:
                # Ready just as the loop decided to stop it; the start task has returned, so the
                # stop is ours to start.
                self._spawn_stop(replica)
                return
            info = event.info
            replica.state = ReplicaState.RUNNING
            replica.address, replica.pid, replica.node = info.address, info.pid, info.node
            replica.view = ServingReplica(replica.tag, replica.version, info.address)
            self._snapshot_dirty = True
            if replica.version == self.spec.version:
                self._failures = 0
            self._schedule_check(replica)
            logger.info("replica %s RUNNING at %s", replica.tag, info.address)
        elif isinstance(event, ev.StartFailed):
            del self.replicas[event.tag]
            self._record_changed()
            if replica.state is not ReplicaState.STOPPING:
                self._start_failed(replica, event.error, event.traceback)
        elif isinstance(event, ev.Stopped):
            del self.replicas[event.tag]
            self._record_changed()
            logger.info("replica %s stopped", replica.tag)
        elif isinstance(event, ev.Died):
            self._died(replica, event.reason)
        elif isinstance(event, ev.Reconfigured):
            replica.scope = None
            if replica.state is ReplicaState.STOPPING:
                # Stopped just as the reconfigure returned; that task has ended, so stop it here.
                self._spawn_stop(replica)
            elif event.error is None:
                replica.state = ReplicaState.RUNNING
                replica.config_digest = event.config_digest
                replica.record_json = None
                self._record_changed()
                self._schedule_check(replica)
                logger.info("replica %s reconfigured", replica.tag)
            else:
                self._failure(
                    replica.tag, "ReconfigureFailed", f"reconfigure failed: {event.error}"
                )
                self._begin_stop(replica, graceful=True)
                self._spawn_stop(replica)
        elif isinstance(event, ev.HealthChecked):
            replica.checking = False
            if replica.state is not ReplicaState.RUNNING:
                return  # stopping, or being reconfigured (checked again once RUNNING)
            if event.error is None:
                replica.check_failures = 0
                replica.healthy = True
            else:
                replica.check_failures += 1
                replica.healthy = False
                threshold = self.spec.backend_config.health_check_failure_threshold
                self._event(
                    "Unhealthy",
                    f"replica {replica.tag}: health check {replica.check_failures}/{threshold} "
                    f"failed: {event.error}",
                )
                if replica.check_failures >= threshold:
                    # Out of the snapshot first (the pass publishes before the stop can act),
                    # then drained and replaced.
                    self._failure(replica.tag, "Unhealthy", f"unhealthy: {event.error}")
                    self._begin_stop(replica, graceful=True)
                    self._spawn_stop(replica)
                    return
            self._schedule_check(replica)

    def _died(self, replica: Replica, reason: str) -> None:
        if replica.state is ReplicaState.STOPPING:
            return  # being stopped anyway; its stop task reports when it is gone
        if replica.state is ReplicaState.STARTING:
            self._start_failed(replica, reason)
        else:
            self._failure(replica.tag, "Died", f"died: {reason}")
        self._begin_stop(replica, graceful=False)
        self._spawn_stop(replica)

    def _start_failed(self, replica: Replica, error: str, traceback: str | None = None) -> None:
        current = replica.version == self.spec.version
        if current:
            self._failures += 1
            self._failed_starts += 1
        limit = self._policy.max_failed_starts
        blocking = current and self._failures >= limit and not self._starts_blocked
        last = blocking or self._starts_blocked
        self._failure(replica.tag, "StartFailed", error, traceback, last=last)
        if blocking:
            self._starts_blocked = True
            reason = (
                f"{self._failures} consecutive replica starts failed; last: {error}. "
                "No new replica will start until the next deploy."
            )
            logger.error("backend %s: deploy failed: %s", self.name, reason)
            self._event("DeployFailed", reason)
            self._blocked_reason = "StartFailures"
            self.goal.fail(reason, traceback)

    def _failure(
        self, tag: str, kind: str, error: str, traceback: str | None = None, *, last: bool = False
    ) -> None:
        """Note a failure (failed start, crash, failed health, failed reconfigure) and back off:
        the next start waits, longer after each failure in a row, so a crash loop never spins.
        `last`: this failure stops new starts until the next deploy (no "next start" then)."""
        self.last_error = self._generation_error = error
        self.last_traceback = traceback
        self._observer.failure(self.name, kind)
        now = trio.current_time()
        if now - self._last_failure_at >= self._policy.reset_after_s:
            self._restarts = 0  # it has been well for a while: forgive the earlier failures
        self._restarts += 1
        self._last_failure_at = now
        delay = self._policy.delay(self._restarts, self._rng)
        self._backoff_until = now + delay
        then = "no new start until the next deploy" if last else f"next start in {delay:.3g}s"
        if traceback:
            logger.warning(
                "replica %s: %s (%s); its traceback:\n%s", tag, error, then, traceback.rstrip()
            )
        else:
            logger.warning("replica %s: %s (%s)", tag, error, then)
        self._event(kind, f"replica {tag}: {error}; {then}")

    def _event(self, kind: str, message: str) -> None:
        self.history.add(kind, message)
        # Stored by the writer, with the replica record or on their own.
        self._write_wanted.set()

    def _schedule_check(self, replica: Replica) -> None:
        period = self.spec.backend_config.health_check_period_s
        if period <= 0:
            replica.next_check_at = math.inf
            return
        replica.next_check_at = trio.current_time() + period
        heapq.heappush(self._health_due, (replica.next_check_at, replica.seq, replica.tag))

    def _run_due_checks(self, now: float) -> None:
        due = self._health_due
        if self.spec.backend_config.health_check_period_s <= 0:
            due.clear()  # turned off by a redeploy: drop what the old spec scheduled
            return
        while due and due[0][0] <= now:
            at, _, tag = heapq.heappop(due)
            replica = self.replicas.get(tag)
            # Entries are checked lazily: one whose replica left, stopped serving or was
            # rescheduled since is simply dropped.
            if (
                replica is None
                or replica.next_check_at != at
                or replica.state is not ReplicaState.RUNNING
                or replica.checking
            ):
                continue
            replica.checking = True
            replica.next_check_at = math.inf
            timeout = self.spec.backend_config.health_check_timeout_s
            self._start_task(self._check, tag, timeout)

    def _arm_timer(self, now: float) -> None:
        """Make the one timer task wake the loop at the next health check or backoff end."""
        when = math.inf
        if self._health_due:
            when = self._health_due[0][0]
        if self._backoff_until > now:
            when = min(when, self._backoff_until)
        if when >= self._timer_at:
            return  # the armed timer fires earlier (or on time); its pass re-arms
        if self._timer_scope is not None:
            self._timer_scope.cancel()
        self._timer_at = when
        self._timer_scope = trio.CancelScope()
        self._start_task(self._timer, self._timer_scope, when)

    async def _timer(self, scope: trio.CancelScope, when: float) -> None:
        with scope:
            await trio.sleep_until(when)
            self._send.send_nowait(ev.Tick(when))

    # -- one pass --

    async def _reconcile(self) -> bool:
        """Plan, publish, checkpoint, act. True once a deleted backend is gone for good.

        Never blocks on storage: the checkpoint is the writer task's, and the actions that
        depend on it wait for its ``Written`` event.
        """
        spec = self.spec
        config = spec.backend_config
        now = trio.current_time()
        surge, unavailable = resolve_limits(
            config.num_replicas, config.max_surge, config.max_unavailable
        )
        target = Target(
            num_replicas=config.num_replicas,
            version=spec.version,
            config_digest=spec.config_digest,
            max_surge=surge,
            max_unavailable=unavailable,
            deleting=spec.deleting,
            starts_blocked=self._starts_blocked,
            starts_deferred=now < self._backoff_until,
        )
        plan = decide(target, list(self.replicas.values()))
        self._observed_generation = spec.generation
        self._converged = plan.converged

        stops = [self.replicas[tag] for tag in plan.stop]
        for replica in stops:
            graceful = not spec.force and replica.state is not ReplicaState.STARTING
            self._begin_stop(replica, graceful=graceful)
        starts = [
            self._add(self._new_tag(), spec.version, spec.config_digest, ReplicaState.STARTING)
            for _ in range(plan.start)
        ]
        updates = [self.replicas[tag] for tag in plan.reconfigure]
        for replica in updates:
            replica.state = ReplicaState.UPDATING
            replica.scope = trio.CancelScope()

        # Watchers first: a replica leaves the snapshot before it is asked to drain.
        self._publish()
        # Then act, each action once the intent behind it is durable.
        for replica in stops:
            self._spawn_stop(replica)
        for replica in starts:
            self._spawn_bring_up(replica, adopt=False)
        for replica in updates:
            self._spawn_reconfigure(replica)
        if starts or stops or updates:
            self._log_decision(len(starts), stops, len(updates))
        self._run_due_checks(now)
        self._arm_timer(now)

        if plan.converged:
            if spec.deleting:
                return await self._forget()
            if not self.goal.done:
                logger.info("backend %s: goal of generation %d reached", self.name, spec.generation)
                self._event("Ready", f"generation {spec.generation} reached")
            self.goal.complete()
        # Let the tasks just started (and watchers just woken) run before the next pass, so a
        # burst of events is coalesced instead of handled one pass each.
        await trio.lowlevel.checkpoint()
        return False

    def _log_decision(self, starts: int, stops: list[Replica], updates: int) -> None:
        """One line per decision, each count with the version it concerns: a rollout's line
        names the version it stops as well as the one it starts."""
        version = self.spec.version
        parts = []
        if starts:
            parts.append(f"starting {starts} (version {version})")
        if stops:
            by_version: dict[str, int] = {}
            for r in stops:
                by_version[r.version] = by_version.get(r.version, 0) + 1
            versions = ", ".join(f"{n} of {v}" for v, n in sorted(by_version.items()))
            if len(by_version) == 1:
                versions = f"version {next(iter(by_version))}"
            parts.append(f"stopping {len(stops)} ({versions})")
        if updates:
            parts.append(f"reconfiguring {updates} (version {version})")
        logger.info("backend %s: %s", self.name, ", ".join(parts))
        if starts or stops:
            self._event("Scale", ", ".join(p for p in parts if not p.startswith("reconfiguring")))

    def _begin_stop(self, replica: Replica, *, graceful: bool) -> None:
        if replica.state in SERVING_STATES:
            self._snapshot_dirty = True
        replica.state = ReplicaState.STOPPING
        replica.graceful = graceful
        replica.drain_scope = trio.CancelScope()
        replica.record_json = None
        self._record_changed()
        logger.info("replica %s STOPPING (%s)", replica.tag, "drain" if graceful else "kill")

    def _add(
        self,
        tag: str,
        version: str,
        config_digest: str,
        state: ReplicaState,
        created_at: float | None = None,
    ) -> Replica:
        self._seq += 1
        replica = Replica(tag, version, config_digest, state, self._seq)
        replica.created_at = time.time() if state is ReplicaState.STARTING else created_at
        if state is ReplicaState.STARTING or state is ReplicaState.RECOVERING:
            # Made now, not when the task starts, so that a stop decided before the task runs
            # can already cancel it.
            replica.scope = trio.CancelScope()
        self.replicas[tag] = replica
        self._record_changed()
        return replica

    def _new_tag(self) -> str:
        while True:
            # Fresh OS randomness, never the seeded generator: a tag must stay unique across
            # controller lifetimes, and a reopened controller with the same seed would replay.
            tag = f"{self.name}#{_tag_rng.getrandbits(48):012x}"
            if tag not in self.replicas:
                return tag

    def _publish(self) -> None:
        if not self._snapshot_dirty:
            return
        self._snapshot_dirty = False
        # A replica has a view from its first RUNNING on; of those, only STOPPING ones do not
        # serve. Identity checks, not `in SERVING_STATES`: this runs over every replica.
        stopping = ReplicaState.STOPPING
        serving = tuple(
            r.view for r in self.replicas.values() if r.view is not None and r.state is not stopping
        )
        spec = self.spec
        deleted = spec.deleting and self.forgotten
        self._hub.publish(
            BackendSnapshot(
                self.name,
                self._hub.next_id(),
                None if deleted else spec.backend_config,
                None if deleted else spec.replica_config,
                serving,
            )
        )

    def _record_text(self) -> str:
        entries = []
        for r in self.replicas.values():
            if r.record_json is None:
                stopping = r.state is ReplicaState.STOPPING
                r.record_json = dump_replica(
                    ReplicaRecord(
                        r.tag,
                        r.version,
                        r.config_digest,
                        stopping,
                        None if r.created_at is None else round(r.created_at * 1000),
                    )
                )
            entries.append(r.record_json)
        return join_replicas(self.name, entries)

    async def _forget(self) -> bool:
        if self._durable_seq < self._record_seq:
            return False  # a write is in flight; its Written event brings another pass
        async with self.lock:
            if not self.spec.deleting or self.replicas:
                return False  # a deploy came in while we waited for the lock
            await self._store.write(
                {
                    spec_key(self.name): None,
                    replicas_key(self.name): None,
                    events_key(self.name): None,
                }
            )
            self.forgotten = True
            self._snapshot_dirty = True
            self._publish()
            self.goal.complete()
            self._on_forgotten(self)
            logger.info("backend %s deleted", self.name)
            return True

    # -- tasks: each reports with exactly one event --

    def _spawn_stop(self, replica: Replica) -> None:
        scope = replica.scope
        if scope is not None:
            # A start, adoption or reconfigure is in flight (or about to be): cancelling it makes
            # that task finish the stop, or, if it already reported, the report's handler does.
            self._act(scope.cancel)
        else:
            self._act(partial(self._start_task, self._stop, replica.tag, replica.graceful))

    def _start_task(self, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    def _spawn_bring_up(self, replica: Replica, *, adopt: bool) -> None:
        scope = replica.scope
        assert scope is not None
        timeout = self.spec.backend_config.start_timeout_s
        spec = None
        if not adopt:
            spec = ReplicaSpec(
                tag=replica.tag,
                backend=self.name,
                version=replica.version,
                replica_config=self.spec.replica_config,
                user_config=self.spec.backend_config.user_config,
                resources=self.spec.backend_config.resources,
            )

        def go() -> None:
            # The start timeout counts from when the runtime is asked, not from the decision.
            scope.deadline = min(scope.deadline, trio.current_time() + timeout)
            self._start_task(self._bring_up, replica.tag, scope, spec)

        self._act(go)

    async def _bring_up(self, tag: str, scope: trio.CancelScope, spec: ReplicaSpec | None) -> None:
        """Start (or, without a spec, adopt) a replica within its start timeout.

        On any way but success this task also cleans up: the replica never served, or (adopted)
        may have, so an adopted one being stopped is drained first.
        """
        error: str | None = None
        traceback: str | None = None
        with scope:
            try:
                if spec is None:
                    result = await self._runtime.adopt_replica(tag)
                else:
                    result = await self._runtime.start_replica(spec)
            except ReplicaError as exc:
                error, traceback = exc.summary, exc.traceback
            except Exception as exc:
                # A runtime that fails this way is broken for this replica, not for the others.
                logger.exception("runtime error starting %s", tag)
                error = f"{type(exc).__name__}: {exc}"
            else:
                info = result if isinstance(result, ReplicaInfo) else ReplicaInfo(result)
                self._send.send_nowait(ev.Started(tag, info))
                return
        replica = self.replicas.get(tag)
        stopped_by_loop = replica is not None and replica.state is ReplicaState.STOPPING
        if error is None and not stopped_by_loop:
            timeout = self.spec.backend_config.start_timeout_s
            error = f"ReplicaStartTimeout: not ready within start_timeout_s={timeout:g}"
        adopted = spec is None
        if stopped_by_loop and adopted and replica is not None and replica.graceful:
            await self._drain(tag)  # it may still be serving routers from before the restart
        await self._kill(tag)
        if stopped_by_loop or adopted:
            # A failed adoption is not a failed start: the plan simply replaces the replica.
            if not stopped_by_loop:
                logger.warning("replica %s: adoption failed (%s); replacing it", tag, error)
            self._send.send_nowait(ev.Stopped(tag))
        else:
            self._send.send_nowait(ev.StartFailed(tag, error or "start failed", traceback))

    def _spawn_reconfigure(self, replica: Replica) -> None:
        scope = replica.scope
        assert scope is not None
        timeout = self.spec.backend_config.start_timeout_s
        config, config_digest = self.spec.backend_config.user_config, self.spec.config_digest

        def go() -> None:
            scope.deadline = min(scope.deadline, trio.current_time() + timeout)
            self._start_task(self._reconfigure, replica.tag, scope, config, config_digest)

        self._act(go)

    async def _reconfigure(
        self, tag: str, scope: trio.CancelScope, user_config: JSON, config_digest: str
    ) -> None:
        error: str | None = None
        with scope:
            try:
                await self._runtime.reconfigure_replica(tag, user_config)
            except ReplicaError as exc:
                error = exc.summary
            except Exception as exc:
                logger.exception("runtime error reconfiguring %s", tag)
                error = f"{type(exc).__name__}: {exc}"
        if scope.cancelled_caught and error is None:
            error = "ReconfigureTimeout: no answer within start_timeout_s"
        replica = self.replicas.get(tag)
        if replica is not None and replica.state is ReplicaState.STOPPING:
            # Stopped (or found dead) while reconfiguring: the stop is this task's to finish.
            await self._stop(tag, replica.graceful)
            return
        self._send.send_nowait(ev.Reconfigured(tag, config_digest, error))

    async def _check(self, tag: str, limit_s: float) -> None:
        error: str | None = None
        with trio.move_on_after(limit_s) as scope:
            try:
                await self._runtime.check_health_replica(tag)
            except ReplicaError as exc:
                error = exc.summary
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
        if scope.cancelled_caught:
            error = f"HealthCheckTimeout: no answer within health_check_timeout_s={limit_s:g}"
        self._send.send_nowait(ev.HealthChecked(tag, error))

    async def _stop(self, tag: str, graceful: bool) -> None:
        if graceful:
            await self._drain(tag)
        await self._kill(tag)
        self._send.send_nowait(ev.Stopped(tag))

    async def _drain(self, tag: str) -> None:
        grace = self.spec.backend_config.graceful_shutdown_timeout_s
        replica = self.replicas.get(tag)
        if grace <= 0 or replica is None or replica.drain_scope is None:
            return
        with replica.drain_scope, trio.move_on_after(grace) as scope:
            try:
                await self._runtime.drain_replica(tag)
            except Exception as exc:
                logger.warning("replica %s: drain failed (%s); killing it now", tag, exc)
        if scope.cancelled_caught:
            logger.info("replica %s: drain not done within %gs; killing it", tag, grace)

    async def _kill(self, tag: str) -> None:
        await kill_replica(self._runtime, tag)

    # -- views --

    def status(self) -> BackendStatus:
        spec = self.spec
        replicas = tuple(
            ReplicaStatus(
                r.tag, r.state, r.version, r.address, r.healthy, r.pid, r.node, r.created_at
            )
            for r in self.replicas.values()
        )
        state, reason = self._state()
        return BackendStatus(
            name=self.name,
            state=state,
            reason=reason,
            message=describe(
                spec.version,
                0 if spec.deleting else spec.backend_config.num_replicas,
                replicas,
                deleting=spec.deleting,
                failed_starts=self._failed_starts,
                error=self._generation_error,
                converged=self._converged,
                starts_blocked=self._starts_blocked,
            ),
            generation=spec.generation,
            observed_generation=self._observed_generation,
            backend_config=spec.backend_config,
            replica_config=spec.replica_config,
            deleting=spec.deleting,
            goal_done=self.goal.done,
            last_error=self.last_error,
            replicas=replicas,
            events=tuple(self.history.events),
            last_traceback=self.last_traceback,
        )

    def _state(self) -> tuple[BackendState, BackendReason]:
        if self.spec.deleting:
            return BackendState.DELETING, "Deleting"
        if self._starts_blocked:
            return BackendState.DEPLOY_FAILED, self._blocked_reason
        if not self.goal.done:
            return self._change
        if self._converged and all(r.healthy for r in self.replicas.values()):
            return BackendState.HEALTHY, "Converged"
        return BackendState.UNHEALTHY, "ReplicaFailures"


async def kill_replica(runtime: Runtime, tag: str) -> None:
    """Kill a replica, shielded and bounded: a kill that has begun finishes even when the
    controller is closing, so no replica is left half-stopped, and a stuck runtime cannot hang
    the close for longer than KILL_TIMEOUT_S."""
    with trio.move_on_after(KILL_TIMEOUT_S, shield=True) as scope:
        try:
            await runtime.kill_replica(tag)
        except Exception:
            logger.exception("replica %s: kill failed", tag)
    if scope.cancelled_caught:
        logger.error("replica %s: kill did not finish within %gs", tag, KILL_TIMEOUT_S)


def _classify(old: Spec, new: Spec) -> tuple[BackendState, BackendReason]:
    """What kind of change a new spec is, for the status while it is under way."""
    if new.deleting:
        return BackendState.DELETING, "Deleting"
    if old.deleting or new.version != old.version:
        return BackendState.UPDATING, "NewVersion"
    if new.config_digest != old.config_digest:
        return BackendState.UPDATING, "NewUserConfig"
    if new.backend_config.num_replicas < old.backend_config.num_replicas:
        return BackendState.DOWNSCALING, "ScaleDown"
    return BackendState.UPSCALING, "ScaleUp"


def _describe_change(old: Spec, new: Spec) -> str:
    if new.deleting:
        return f"generation {new.generation}: delete{' (forced)' if new.force else ''}"
    return (
        f"generation {new.generation}: {plural(new.backend_config.num_replicas, 'replica')} of "
        f"version {new.version} (was {old.backend_config.num_replicas} of {old.version})"
    )
