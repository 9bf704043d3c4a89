"""One backend: its task, its nursery, its replicas and its reconcile loop.

The loop is the only writer of the backend's state. A spec change arrives as an event with its
goal; every start, adoption, reconfigure, health check and stop runs as a task in the backend's
nursery and reports with one event (``_replica_tasks``). The loop wakes on its channel, applies
every queued event, asks the pure ``decide`` for a plan, publishes the watch snapshot, and acts,
each action once the intent behind it is durable (``_intent``). It decides every stop itself.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from typing import Any, final

import trio

from . import _events as ev
from . import _replica_tasks as tasks
from ._backend_view import (
    classify,
    decision,
    describe_change,
    describe_new,
    snapshot_of,
    status_of,
)
from ._checkpoint import (
    EventsRecord,
    ReplicasRecord,
    events_key,
    replicas_key,
    spec_key,
)
from ._failures import FailureBook
from ._goal import Goal
from ._health import HealthChecks
from ._history import EventLog, plural
from ._intent import Intent
from ._json import JSON
from ._observe import Observer
from ._policy import RestartPolicy
from ._reconcile import Target, decide, resolve_limits
from ._replica import UNKNOWN_CONFIG, Replica, ReplicaSet, Spec, new_tag
from ._runtime import ReplicaSpec, Runtime
from ._state import (
    BackendReason,
    BackendState,
    BackendStatus,
    ReplicaState,
    ServingReplica,
)
from ._store import Store
from ._watch import SnapshotHub

logger = logging.getLogger("controller")

KILL_TIMEOUT_S = tasks.KILL_TIMEOUT_S


@final
class Backend:
    """A backend's state and its task. Made by the controller; ``run`` is the task."""

    def __init__(
        self,
        name: str,
        spec: Spec,
        goal: Goal,
        *,
        runtime: Runtime,
        store: Store,
        hub: SnapshotHub,
        lock: trio.Lock,
        requested: Callable[[], int],
        on_forgotten: Callable[[Backend], None],
        on_pass: Callable[[], None],
        policy: RestartPolicy,
        rng: random.Random,
        observer: Observer,
    ):
        self.name = name
        self.spec = spec
        self.goal = goal
        self.lock = lock
        """Held by deploy and delete while they write the spec, and by the loop while it forgets
        a deleted backend, so that a deploy racing a finished delete is never lost."""
        self._set = ReplicaSet(name, lambda: self._intent.changed())
        self.replicas = self._set.by_tag
        self.forgotten = False
        self._hub = hub
        self._requested = requested
        self._on_forgotten = on_forgotten
        self._on_pass = on_pass
        self._observer = observer
        # Unbounded, and that is safe: every event answers a task the loop itself started (one
        # each), a death (at most one per replica) or a spec change (one per deploy). Senders
        # must never block: some of them run in the runtime's own callbacks.
        self._send, self._receive = trio.open_memory_channel[ev.Event](math.inf)
        self._failures = FailureBook(policy, rng)
        self.last_error: str | None = None
        """The most recent failure of any generation."""
        self.last_traceback: str | None = None
        self._timer_at = math.inf
        self._timer_scope: trio.CancelScope | None = None
        self._change: tuple[BackendState, BackendReason] = classify(spec, spec)
        self._observed_generation = 0
        self._converged = False
        self._snapshot_dirty = True
        self.history = EventLog(name)
        self._intent = Intent(name, store, self._set.record_text, self.history, self._send_nowait)
        self._tasks = tasks.Launcher(runtime, self._intent, self._send_nowait)
        self._health = HealthChecks(self._tasks, self._check_failed, self._ready_changed)
        self._event("Delete" if spec.deleting else "Deploy", describe_new(spec))

    # -- called by the controller: it reads, and it sends events --

    def request(self, spec: Spec, goal: Goal) -> trio.Event:
        """Hand the loop a spec that is durable already, with its goal; the event returned is
        set once the loop has taken it."""
        applied = trio.Event()
        self._send_nowait(ev.SpecChanged(spec, goal, applied))
        return applied

    def notify_died(self, tag: str, reason: str) -> None:
        self._send_nowait(ev.Died(tag, reason))

    @property
    def blocked(self) -> bool:
        """It starts nothing until its next deploy (DEPLOY_FAILED on its starts)."""
        return self._failures.starts_blocked

    @property
    def deploy_failed(self) -> bool:
        """DEPLOY_FAILED, for any reason: the same spec deployed again is a new attempt."""
        return self._failures.blocked is not None

    def restore(
        self, record: ReplicasRecord | None, live: set[str], events: EventsRecord | None
    ) -> list[str]:
        """Before ``run``: rebuild replicas from a checkpoint, adopting what is alive and
        forgetting what is not (returned, for the runtime to clear what they left behind)."""
        dropped: list[str] = []
        for rec in record.replicas if record is not None else ():
            if rec.tag not in live:
                # Never started, or gone while the controller was down: the plan replaces it.
                dropped.append(rec.tag)
                continue
            state = ReplicaState.STOPPING if rec.stopping else ReplicaState.RECOVERING
            created = None if rec.created_ms is None else rec.created_ms / 1000
            replica = self._set.add(rec.tag, rec.version, rec.config_digest, state, created)
            replica.adopted = True
            replica.served = rec.served
            replica.graceful = not self.spec.force
            if rec.stopping and replica.graceful:
                replica.drain_scope = trio.CancelScope()
        self._intent.restored(changed=bool(dropped))
        if not self.spec.deleting:
            self._change = (BackendState.UPDATING, "Recovering")
        self.history.restore(events)
        self._event(
            "Recovered",
            f"generation {self.spec.generation}: adopting "
            f"{plural(len(self.replicas), 'live replica')}",
        )
        return dropped

    def block_starts(self, reason: str) -> None:
        """Before ``run``: start nothing new until the next deploy, because the spec cannot be
        placed (a spec stored before the runtime shrank). Replicas already there stay."""
        self._failures.blocked = "Infeasible"
        self._failures.error = self.last_error = reason
        logger.error("backend %s: %s", self.name, reason)
        self._event("Infeasible", reason)
        self.goal.fail(reason)

    # -- the task --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._tasks.nursery = nursery
            nursery.start_soon(self._intent.run)
            # What a previous controller left in flight; its intent is already stored.
            for replica in list(self.replicas.values()):
                if replica.state is ReplicaState.RECOVERING:
                    self._spawn_bring_up(replica, adopt=True)
                elif replica.state is ReplicaState.STOPPING:
                    self._spawn_stop(replica)
            task_status.started()
            done = await self._pass()
            while not done:
                event = await self._receive.receive()
                taken_at = trio.current_time()
                handled = 0
                # Coalesce a burst: one pass for everything already queued.
                while True:
                    self._apply(event)
                    handled += 1
                    try:
                        event = self._receive.receive_nowait()
                    except trio.WouldBlock:
                        break
                done = await self._pass()
                self._observer.events_handled(self.name, handled, trio.current_time() - taken_at)
                self._on_pass()
            # Forgotten: no replica is left, so the only task still here is the idle writer.
            nursery.cancel_scope.cancel()
        self._observer.forgotten(self.name)  # after its last pass is counted

    def _send_nowait(self, event: ev.Event) -> None:
        self._send.send_nowait(event)

    # -- events --

    def _apply(self, event: ev.Event) -> None:
        if isinstance(event, ev.SpecChanged):
            self._take_spec(event.spec, event.goal)
            event.applied.set()
            return
        if isinstance(event, ev.Tick):
            if event.at == self._timer_at:  # not a stale tick of a timer since replaced
                self._timer_at, self._timer_scope = math.inf, None
            return
        if isinstance(event, ev.Written):
            self._intent.written(event.seq)
            return
        replica = self.replicas.get(event.tag)
        if replica is None:
            return  # a late report about a replica already forgotten
        if isinstance(event, ev.Started):
            self._started(replica, event.info)
        elif isinstance(event, ev.StartFailed):
            self._start_failed(replica, event.error, event.traceback)
        elif isinstance(event, ev.Stopped):
            self._set.remove(event.tag)
            logger.info("replica %s stopped", replica.tag)
        elif isinstance(event, ev.Died):
            self._died(replica, event.reason)
        elif isinstance(event, ev.Reconfigured):
            self._reconfigured(replica, event)
        else:
            self._health.reported(replica, event.error)

    def _take_spec(self, spec: Spec, goal: Goal) -> None:
        old = self.spec
        self.goal.supersede()
        self.spec, self.goal = spec, goal
        # A new spec is a new attempt: the failures of the one it replaces do not carry over.
        self._failures.new_generation()
        self._change = classify(old, spec)
        self._event("Delete" if spec.deleting else "Deploy", describe_change(old, spec))
        if spec.force:
            # Forced: the drains under way are cut short, and the kills follow at once.
            for replica in self.replicas.values():
                if replica.state is ReplicaState.STOPPING and replica.graceful:
                    replica.graceful = False
                    if replica.drain_scope is not None:
                        replica.drain_scope.cancel()
        period = spec.backend_config.health_check_period_s
        if period != old.backend_config.health_check_period_s:
            # A new period (or checks turned on or off) applies to the replicas running now.
            self._health.schedule.clear()
            now = trio.current_time()
            for replica in self.replicas.values():
                if replica.state is ReplicaState.RUNNING:
                    self._health.schedule.schedule(replica, now, period)
        self._snapshot_dirty = True

    def _started(self, replica: Replica, info: Any) -> None:
        replica.scope = None
        if replica.state is ReplicaState.STOPPING:
            self._spawn_stop(replica)  # ready just as the loop decided to stop it
            return
        replica.state = ReplicaState.RUNNING
        replica.address, replica.pid, replica.node = info.address, info.pid, info.node
        replica.view = ServingReplica(replica.tag, replica.version, info.address)
        self._snapshot_dirty = True
        if not replica.served:
            replica.served = True
            replica.record_json = None
            self._intent.touched()  # stored with the next write; no action waits on it
        self._failures.ready(replica.version == self.spec.version)
        self._health.schedule.schedule(
            replica, trio.current_time(), self.spec.backend_config.health_check_period_s
        )
        logger.info("replica %s RUNNING at %s", replica.tag, info.address)

    def _start_failed(self, replica: Replica, error: str | None, traceback: str | None) -> None:
        replica.scope = None
        if replica.state is ReplicaState.STOPPING:
            self._spawn_stop(replica)  # the loop stopped it; its start task has ended
            return
        if error is None:
            timeout = self.spec.backend_config.start_timeout_s
            error = f"ReplicaStartTimeout: not ready within start_timeout_s={timeout:g}"
        if replica.adopted:
            # Not a failed start of the version: the plan simply replaces it.
            logger.warning("replica %s: adoption failed (%s); replacing it", replica.tag, error)
            self._event("AdoptionFailed", f"replica {replica.tag}: {error}; replacing it")
        else:
            self._count_failed_start(replica, error, traceback)
        self._stop_now(replica, graceful=False)  # what a failed start left behind

    def _count_failed_start(self, replica: Replica, error: str, traceback: str | None) -> None:
        blocks = self._failures.start_failed(replica.version == self.spec.version)
        self._failure(replica.tag, "StartFailed", error, traceback)
        if blocks:
            reason = self._failures.why_blocked(error)
            logger.error("backend %s: deploy failed: %s", self.name, reason)
            self._event("DeployFailed", reason)
            self.goal.fail(reason, traceback)

    def _died(self, replica: Replica, reason: str) -> None:
        if replica.state is ReplicaState.STOPPING:
            return  # being stopped anyway; its stop task reports when it is gone
        if replica.state is ReplicaState.STARTING:
            self._count_failed_start(replica, reason, None)
        else:
            self._failure(replica.tag, "Died", f"died: {reason}")
        self._stop_now(replica, graceful=False)

    def _reconfigured(self, replica: Replica, event: ev.Reconfigured) -> None:
        replica.scope = None
        if replica.state is ReplicaState.STOPPING:
            self._spawn_stop(replica)  # stopped while it reconfigured; that task has ended
            return
        error = event.error
        if error is None and event.cut:
            error = "ReconfigureTimeout: no answer within start_timeout_s"
        if error is None:
            replica.state = ReplicaState.RUNNING
            self._set.set_config(replica, event.config_digest)
            self._health.schedule.schedule(
                replica, trio.current_time(), self.spec.backend_config.health_check_period_s
            )
            logger.info("replica %s reconfigured", replica.tag)
            return
        message = f"reconfigure failed: {error}"
        self._failure(replica.tag, "ReconfigureFailed", message)
        spec = self.spec
        if (
            self._failures.blocked is None
            and spec.rollback is not None
            and event.config_digest == spec.config_digest
        ):
            # An in-place change is a rollout too: its first failure halts it. The replicas
            # not reconfigured yet keep the config before it; this one is taken back to it (the
            # plan does that), or replaced with it if that fails too.
            self._failures.blocked = "ReconfigureFailed"
            reason = f"the new user config failed in replica {replica.tag}: {error}"
            logger.error("backend %s: deploy failed: %s", self.name, reason)
            self._event("DeployFailed", reason)
            self.goal.fail(reason)
            replica.state = ReplicaState.RUNNING
            self._set.set_config(replica, UNKNOWN_CONFIG)
            return
        self._stop_now(replica, graceful=True)

    def _ready_changed(self) -> None:
        self._snapshot_dirty = True

    def _check_failed(self, replica: Replica, error: str) -> None:
        """A failed or late health check (the replica is out of the watch snapshot already):
        replaced after `health_check_failure_threshold` in a row (not live)."""
        threshold = self.spec.backend_config.health_check_failure_threshold
        self._event(
            "Unhealthy",
            f"replica {replica.tag}: health check {replica.check_failures}/{threshold} "
            f"failed: {error}",
        )
        if replica.check_failures >= threshold:
            self._failure(replica.tag, "Unhealthy", f"unhealthy: {error}")
            self._stop_now(replica, graceful=True)

    def _failure(self, tag: str, kind: str, error: str, traceback: str | None = None) -> None:
        """Note a failure and back off: the next start waits, longer after each failure in a
        row, so a crash loop never spins."""
        self.last_error, self.last_traceback = error, traceback
        self._observer.failure(self.name, kind)
        then = self._failures.failed(trio.current_time(), error)
        if traceback:
            logger.warning(
                "replica %s: %s (%s); its traceback:\n%s", tag, error, then, traceback.rstrip()
            )
        else:
            logger.warning("replica %s: %s (%s)", tag, error, then)
        self._event(kind, f"replica {tag}: {error}; {then}")

    def _event(self, kind: str, message: str) -> None:
        self.history.add(kind, message)
        self._intent.events_changed()

    # -- one pass --

    async def _pass(self) -> bool:
        """Plan, publish, act. True once a deleted backend is gone for good."""
        spec = self.spec
        config = spec.backend_config
        now = trio.current_time()
        surge, unavailable = resolve_limits(
            config.num_replicas, config.max_surge, config.max_unavailable
        )
        config_digest, user_config = self._target_config()
        target = Target(
            num_replicas=config.num_replicas,
            version=spec.version,
            config_digest=config_digest,
            max_surge=surge,
            max_unavailable=unavailable,
            deleting=spec.deleting,
            starts_blocked=self._failures.starts_blocked,
            starts_deferred=self._failures.deferred(now),
        )
        plan = decide(target, list(self.replicas.values()))
        self._observed_generation = spec.generation
        self._converged = plan.converged

        stops = [self.replicas[tag] for tag in plan.stop]
        for replica in stops:
            graceful = not spec.force and replica.state is not ReplicaState.STARTING
            self._begin_stop(replica, graceful=graceful)
        starts = [
            self._set.add(new_tag(self.name, self.replicas), spec.version, config_digest)
            for _ in range(plan.start)
        ]
        updates = [self.replicas[tag] for tag in plan.reconfigure]
        if user_config is None:
            # Only a config that is not None is handed to replicas (new ones get none either):
            # those that had one are up to date as they are.
            for replica in updates:
                self._set.set_config(replica, config_digest)
            updates = []
        for replica in updates:
            replica.state = ReplicaState.UPDATING
            replica.scope = trio.CancelScope()

        # Watchers first: a replica leaves the snapshot before it is asked to drain.
        self._publish()
        for replica in stops:
            self._spawn_stop(replica)
        for replica in starts:
            self._spawn_bring_up(replica, adopt=False)
        for replica in updates:
            self._tasks.reconfigure(replica, user_config, config_digest, config.start_timeout_s)
        if starts or stops or updates:
            line = decision(spec.version, len(starts), [r.version for r in stops], len(updates))
            logger.info("backend %s: %s", self.name, line)
            if starts or stops:
                self._event("Scale", line.partition(", reconfiguring")[0])
        self._health.run_due(now, self.replicas, config)
        self._publish()  # a late health check may have taken a replica out
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

    def _target_config(self) -> tuple[str, JSON]:
        """The user config replicas should hold: the spec's, or, once it failed in a replica,
        the one before it."""
        spec = self.spec
        if self._failures.blocked == "ReconfigureFailed" and spec.rollback is not None:
            return spec.rollback
        return spec.config_digest, spec.backend_config.user_config

    def _arm_timer(self, now: float) -> None:
        """Make the one timer task wake the loop at the next health check or backoff end."""
        when = self._health.schedule.next_at
        if self._failures.backoff_until > now:
            when = min(when, self._failures.backoff_until)
        if when >= self._timer_at:
            return  # the armed timer fires earlier (or on time); its pass re-arms
        if self._timer_scope is not None:
            self._timer_scope.cancel()
        self._timer_at = when
        self._timer_scope = trio.CancelScope()
        self._tasks.timer(self._timer_scope, when)

    # -- replicas --

    def _begin_stop(self, replica: Replica, *, graceful: bool) -> None:
        if self._set.begin_stop(replica, graceful=graceful):
            self._snapshot_dirty = True  # out of the watch snapshot before it is asked to drain
        logger.info("replica %s STOPPING (%s)", replica.tag, "drain" if graceful else "kill")

    def _stop_now(self, replica: Replica, *, graceful: bool) -> None:
        self._begin_stop(replica, graceful=graceful)
        self._spawn_stop(replica)

    def _spawn_stop(self, replica: Replica) -> None:
        self._tasks.stop(replica, self.spec.backend_config.graceful_shutdown_timeout_s)

    def _spawn_bring_up(self, replica: Replica, *, adopt: bool) -> None:
        spec = None
        if not adopt:
            spec = ReplicaSpec(
                tag=replica.tag,
                backend=self.name,
                version=replica.version,
                replica_config=self.spec.replica_config,
                user_config=self._target_config()[1],
                resources=self.spec.backend_config.resources,
            )
        self._tasks.bring_up(replica, spec, self.spec.backend_config.start_timeout_s)

    def _publish(self) -> None:
        if self._snapshot_dirty:
            self._snapshot_dirty = False
            self._hub.publish(
                snapshot_of(
                    self.name, self._hub.next_id(), self.spec, self.replicas, self.forgotten
                )
            )

    async def _forget(self) -> bool:
        if not self._intent.durable:
            return False  # a write is in flight; its Written event brings another pass
        async with self.lock:
            if self._requested() != self.spec.generation or self.replicas:
                return False  # a deploy came in while we waited for the lock: its spec is next
            keys = (spec_key(self.name), replicas_key(self.name), events_key(self.name))
            await self._intent.write(dict.fromkeys(keys))
            self.forgotten = True
            self._snapshot_dirty = True
            self._publish()
            self.goal.complete()
            self._on_forgotten(self)
            logger.info("backend %s deleted", self.name)
            return True

    # -- views --

    def status(self) -> BackendStatus:
        return status_of(
            self.name,
            self.spec,
            self.replicas.values(),
            self._failures,
            goal=self.goal,
            observed_generation=self._observed_generation,
            converged=self._converged,
            change=self._change,
            last_error=(self.last_error, self.last_traceback),
            events=self.history.events,
        )
