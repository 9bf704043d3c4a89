"""The reduce half of a backend's loop: how each event changes the backend's state.

A spec taken, a replica started, failed, died, reconfigured or found unhealthy: each is applied
by one small method, in the order the events came, before the pass decides anything. What a
checkpoint holds is applied the same way, once, before the backend's task runs (``restore``).
What the events stop is marked STOPPING here; the reducer starts no replica task: what it
leaves to do (``Due``) is the executor's (``act``). A replica's death, failed health check,
failed start or failed reconfigure is recorded (``take_failures``) and judged by the loop
(``judge_failures``): whether it fails the deploy, aborts the canary or replaces the replica is
not the reducer's to say.
"""

from __future__ import annotations

import logging
import math

import attrs
import trio

from .._model.config.traffic import DEFAULT_MAX_UPLOADS
from .._model.decisions.failures import Failure, ReconfigureFailure, ReplicaFailure, StartFailure
from .._model.decisions.spec import Spec
from .._model.records.records import EventsRecord, ReplicasRecord
from .._model.records.replica_state import ReplicaState
from .._model.views.status import BackendState, LoadReport
from .._ports.runtime import ReplicaInfo
from . import events as ev
from . import tasks as tasks
from . import view as view
from .failure_reports import FailureReports
from .goal import Goal
from .health import HealthChecks
from .intent import Intent
from .loop_state import LoopState
from .replica import UNKNOWN_CONFIG, Replica
from .rollout import Rollout
from .settle import GoalSettler
from .shared import Shared
from .snapshot import Snapshot

logger = logging.getLogger("controller")


@attrs.frozen
class Due:
    """What applying events left to do: the stops to start (marked STOPPING already), whether
    every drain under way is cut short (a forced spec), and when a tick must come for the watch
    snapshot (what multiplexed replicas hold, published at most every ``HELD_PUBLISH_S``)."""

    stops: tuple[Replica, ...] = ()
    cut_drains: bool = False
    tick_at: float = math.inf


_NOTHING_DUE = Due()


class Reducer:
    """Applies events to a backend's state (``LoopState``): the loop's only way of changing it
    between passes."""

    def __init__(
        self,
        state: LoopState,
        snapshot: Snapshot,
        *,
        tasks: tasks.Launcher,
        alarm: tasks.Alarm,
        intent: Intent,
        reports: FailureReports,
        rollout: Rollout,
        health: HealthChecks,
        settler: GoalSettler,
        shared: Shared,
    ):
        self._state = state
        # Its parts, held here too: each keeps its own state, and none is ever replaced.
        self._set = state.set
        self._replicas = state.replicas
        self._failures = state.failures
        self._scaling = state.scaling
        self._canary = state.canary
        self._journal = state.journal
        self._snapshot = snapshot
        self._tasks = tasks
        self._alarm = alarm
        self._intent = intent
        self._reports = reports
        self._rollout = rollout
        self._health = health
        self._settler = settler
        self._shared = shared
        # What the events left to do, for the executor: the reducer records, and starts no task.
        self._stops_due: list[Replica] = []
        self._cut_drains = False
        # Failures, for the loop to judge (``judge_failures``): what each does (fails the
        # deploy, aborts the canary, replaces the replica) is a verdict.
        self._failed: list[Failure] = []

    # -- what the store held, before the task runs --

    def restore(
        self, record: ReplicasRecord | None, live: set[str], events: EventsRecord | None
    ) -> list[str]:
        """Before ``run``: rebuild replicas from a checkpoint, adopting what is alive and
        forgetting what is not (returned, for the runtime to clear what they left behind)."""
        # Those not alive, the plan replaces.
        dropped = self._set.restore(record, live, graceful=not self._state.spec.force)
        self._reports.restore(record.failed if record is not None else None)
        self._state.restored = True
        rollout = record.rollout if record is not None else None
        self._rollout.restore(rollout, trio.current_time())
        canary = rollout.canary if rollout is not None else None
        self._canary.restore(canary, self._state.spec, trio.current_time())
        for rec in record.replicas if record is not None else ():
            if rec.tag in dropped and rec.served and not rec.stopping:
                # Gone while no controller ran: a canary's replica died as surely as one
                # seen to die (its first pass aborts it).
                self._canary.lost(rec.tag, rec.version)
        autoscale = record.autoscale if record is not None else None
        self._scaling.restore(autoscale, self._state.spec.backend_config, trio.current_time())
        self._intent.restored(changed=bool(dropped))
        if not self._state.spec.deleting:
            self._state.change = (BackendState.UPDATING, "Recovering")
        self._journal.log.restore(events)
        self._journal.recovered(self._state.spec.generation, len(self._replicas))
        return dropped

    def show_as_stored(self) -> None:
        """After ``restore``, for a standby's view (which never runs): publish the replicas that
        served, and say the backend is what its spec and replicas make it, not recovering."""
        for replica in self._replicas.values():
            # As the leader last wrote it: those that served, serve (a standby does not look).
            if replica.state is ReplicaState.RECOVERING and replica.view is not None:
                self._set.mark(replica, state=ReplicaState.RUNNING)
        self._state.change = view.classify(self._state.spec, self._state.spec)
        # The leader writes a spec before it acts on it: the stored spec is the one it follows.
        self._state.observed_generation = self._state.spec.generation
        self._scaling.as_stored()
        running = [r for r in self._replicas.values() if r.state is ReplicaState.RUNNING]
        if len(running) == len(self._replicas) == self._state.desired and all(
            r.version == self._state.spec.version for r in running
        ):
            # All there, as asked: what the leader reported as its goal reached.
            self._state.converged = True
            self._state.goal.complete()
        self._snapshot.publish()

    def _own_load(self, event: ev.OwnLoad) -> bool:
        """Keep what a replica says of itself; True if a pass should follow (the book's totals
        moved, or what it holds of its models is due in a snapshot)."""
        tag, code = event.tag, event.code
        if tag not in self._replicas:
            return False  # a late report about a replica already forgotten
        moved = self._scaling.report_own(tag, event.ongoing, event.served, code)
        models = None if code is None else code.models
        # Routers that have not heard from it yet learn where its models are with a snapshot.
        return (models is not None and self._snapshot.held(tag, models.held)) or moved

    def block_starts(self, reason: str) -> None:
        """Before ``run``: start nothing new until the next deploy, because the spec cannot be
        placed (a spec stored before the runtime shrank). Replicas already there stay."""
        self._reports.infeasible(reason)

    def take_due(self) -> Due:
        """What the events applied since the last call left for the executor to do."""
        tick_at = self._snapshot.take_tick()
        if not self._stops_due and not self._cut_drains and tick_at == math.inf:
            return _NOTHING_DUE  # most bursts (load, passing checks): nothing made for them
        # Once each: a replica that died while starting is stopped for its death and again when
        # its start task reports, and both may come in one burst.
        due = Due(tuple(dict.fromkeys(self._stops_due)), self._cut_drains, tick_at)
        self._stops_due.clear()
        self._cut_drains = False
        return due

    def take_failures(self) -> tuple[Failure, ...]:
        """The failures recorded since the last call, in the order they came."""
        if not self._failed:
            return ()  # asked after every event: most record none
        failed = tuple(self._failed)
        self._failed.clear()
        return failed

    def apply(self, event: ev.Event) -> bool:
        """Take `event` in; True if it changed nothing a pass decides on (checks that passed,
        of replicas already healthy), so that a pass for it alone would decide what the last
        one did."""
        if isinstance(event, ev.HealthChecked):
            quiet = True
            for tag, error in event.results:
                checked = self._replicas.get(tag)
                if checked is not None:  # else a late report about a replica already forgotten
                    quiet = not self._health.reported(checked, error) and quiet
            return quiet
        if isinstance(event, ev.LoadReported):
            # A pass for the autoscaler when the book's totals moved, and for the canary when
            # its numbers may move it (a gate failing, or enough of them once its pause is over).
            moved = self._scaling.report(self._known(event.report), event.at)
            judged = bool(event.report.traffic) and self._canary.report(event.report.traffic)
            return not (moved or judged)
        if isinstance(event, ev.OwnLoad):
            return not self._own_load(event)
        self._take(event)
        return False

    def _known(self, report: LoadReport) -> LoadReport:
        """`report` with only the replicas this backend has (others are dropped, and counted),
        each at most its ``max_ongoing_requests`` and the uploads an ingress process sends
        beside them: no source makes up replicas or loads that the status and the autoscaler
        would take for real."""
        cap = self._state.spec.backend_config.max_ongoing_requests + DEFAULT_MAX_UPLOADS
        known = {t: min(n, cap) for t, n in report.in_flight.items() if t in self._replicas}
        if len(known) != len(report.in_flight):
            self._shared.observer.unknown_load(self._state.name, len(report.in_flight) - len(known))
        return report if known == report.in_flight else attrs.evolve(report, in_flight=known)

    def _take(self, event: ev.Event) -> None:
        if isinstance(event, ev.SpecChanged):
            self._take_spec(event.spec, event.goal)
            event.applied.set()
            return
        if isinstance(event, ev.Tick):
            self._alarm.rang(event.at)
            self._snapshot.tick(event.at)
            return
        if isinstance(event, ev.Written):
            self._intent.written(event.seq)
            return
        if isinstance(event, ev.RoomChecked):
            self._scaling.room_checked(event)
            return
        if isinstance(event, ev.NodesChanged):
            self._failures.nodes_changed()
            return  # the pass reads the nodes to move off
        if isinstance(event, ev.CanaryCommand):
            self._canary.steer(event.what, event.via, trio.current_time())
            event.applied.set()
            return
        assert not isinstance(event, ev.HealthChecked | ev.LoadReported | ev.OwnLoad)
        replica = self._replicas.get(event.tag)
        if replica is None:
            return  # a late report about a replica already forgotten
        if isinstance(event, ev.Started):
            self._started(replica, event.info)
        elif isinstance(event, ev.StartFailed):
            self._start_failed(replica, event.error, event.traceback)
        elif isinstance(event, ev.Stopped):
            self._set.remove(event.tag)
            self._tasks.gone(event.tag)
            self._scaling.gone(event.tag)
            self._snapshot.gone(event.tag)
            self._settler.gone()
            logger.info("replica %s stopped", replica.tag)
        elif isinstance(event, ev.Died) and event.node is not None:
            self._lost_with_node(replica, event.reason, event.node)
        elif isinstance(event, ev.Died):
            self._died(replica, event.reason)
        else:
            self._reconfigured(replica, event)

    def _take_spec(self, spec: Spec, goal: Goal) -> None:
        old = self._state.spec
        if spec.generation == old.generation:
            # Paused or resumed with nothing to roll out: the same spec and goal, noted.
            self._state.spec = spec
            self._journal.event("Paused" if spec.paused else "Resumed", view.describe_pause(spec))
            return
        self._settler.supersede(self._state.goal)
        self._state.spec, self._state.goal = spec, goal
        # A new spec is a new attempt: the failures of the one it replaces do not carry over.
        self._failures.new_generation()
        self._set.set_failed(None)
        self._state.change = view.classify(old, spec, self._state.revisions.get(spec.revision))
        self._journal.event(
            "Delete" if spec.deleting else "Deploy", view.describe_change(old, spec)
        )
        self._rollout.taken(old, spec, trio.current_time())
        if spec.force:
            self._set.cut_drains()
            self._cut_drains = True
        self._scaling.configure(spec.backend_config, trio.current_time())
        period = spec.backend_config.health_check_period_s
        if period != old.backend_config.health_check_period_s:
            self._health.reschedule(self._replicas, trio.current_time(), period)
        self._snapshot.changed()

    def _started(self, replica: Replica, info: ReplicaInfo) -> None:
        self._tasks.ended(replica.tag)
        if replica.state is ReplicaState.STOPPING:
            self._stops_due.append(replica)  # ready just as the loop decided to stop it
            return
        if self._set.running(replica, info):
            self._intent.touched()  # stored with the next write; no action waits on it
        self._snapshot.changed()
        of_target = replica.version == self._state.spec.version
        self._failures.ready(of_target)
        if of_target:
            self._ready(replica)
        self._health.begin(replica, self._state.spec.backend_config)
        logger.info("replica %s RUNNING at %s", replica.tag, info.address)
        self._settler.gone()  # its start has ended: a failure waiting may resolve

    def _start_failed(self, replica: Replica, error: str | None, traceback: str | None) -> None:
        self._tasks.ended(replica.tag)
        if replica.state is ReplicaState.STOPPING:
            self._stops_due.append(replica)  # the loop stopped it; its start task has ended
            return
        if error is None:
            timeout = self._state.spec.backend_config.start_timeout_s
            error = f"ReplicaStartTimeout: not ready within start_timeout_s={timeout:g}"
        if replica.adopted:
            # Not a failed start of the version: the plan simply replaces it.
            logger.warning("replica %s: adoption failed (%s); replacing it", replica.tag, error)
            self._journal.event("AdoptionFailed", f"replica {replica.tag}: {error}; replacing it")
        else:
            self._record_start_failure(replica, error, traceback)
        # What a failed start left behind (its process may live on: a hung start, a worker that
        # failed to import): a goal this failure fails waits until it is gone (``settle``).
        self._stop_now(replica, graceful=False)

    def _died(self, replica: Replica, reason: str) -> None:
        if replica.state is ReplicaState.STOPPING:
            return  # being stopped anyway; its stop task reports when it is gone
        if replica.state is ReplicaState.STARTING:
            # Never ready: a failed start, which no rollout or canary is judged by.
            self._record_start_failure(replica, reason, None)
        else:
            self._failed.append(
                ReplicaFailure(
                    replica.tag,
                    replica.version,
                    reason,
                    replica.ready_at,
                    trio.current_time(),
                )
            )
        self._stop_now(replica, graceful=False)

    def _record_start_failure(self, replica: Replica, error: str, traceback: str | None) -> None:
        of_target = replica.version == self._state.spec.version
        in_a_row = self._failures.count_start(of_target, error)
        self._failed.append(StartFailure(replica.tag, replica.version, error, traceback, in_a_row))

    def _lost_with_node(self, replica: Replica, reason: str, node: str) -> None:
        """`replica` went with its lost node: no crash of its own (the release is not judged by
        it, nor is a start counted failed), so its replacement waits out no backoff. A backend
        whose replicas crash as well still backs off: the crashes do."""
        if replica.state is ReplicaState.STOPPING:
            return
        logger.warning("replica %s: its node %s was lost (%s)", replica.tag, node, reason)
        self._journal.event("NodeLost", f"replica {replica.tag}: its node {node} was lost")
        self._stop_now(replica, graceful=False)

    def _reconfigured(self, replica: Replica, event: ev.Reconfigured) -> None:
        self._tasks.ended(replica.tag)
        if replica.state is ReplicaState.STOPPING:
            self._stops_due.append(replica)  # stopped while it reconfigured; that task has ended
            return
        error = event.error
        if error is None and event.cut:
            timeout = self._state.spec.backend_config.start_timeout_s
            error = f"ReconfigureTimeout: no answer within start_timeout_s={timeout:g}"
        if error is None:
            self._set.mark(replica, state=ReplicaState.RUNNING)
            spec = self._state.spec
            if event.config_digest == spec.config_digest:
                self._set.set_config(replica, event.config_digest, spec.revision)
                self._ready(replica)
            else:
                self._set.set_config(replica, event.config_digest)
            self._health.begin(replica, spec.backend_config)
            logger.info("replica %s reconfigured", replica.tag)
            return
        # Running on with a config no one knows: the loop judges whether it is taken back to
        # the config before (the rollout halts) or replaced.
        self._set.mark(replica, state=ReplicaState.RUNNING)
        self._set.set_config(replica, UNKNOWN_CONFIG)
        to_spec = event.config_digest == self._state.spec.config_digest
        self._failed.append(ReconfigureFailure(replica.tag, error, to_spec))

    def _ready(self, replica: Replica) -> None:
        """`replica`, of the spec's version, became ready (or took the spec's config)."""
        now = trio.current_time()
        self._set.mark(replica, ready_at=now)
        self._rollout.ready(now)

    def check_failed(self, replica: Replica, error: str) -> None:
        """A failed or late health check (the replica is out of the watch snapshot already):
        told, and recorded for the loop to judge (replaced at
        ``health_check_failure_threshold`` in a row)."""
        threshold = self._state.spec.backend_config.health_check_failure_threshold
        self._journal.event(
            "Unhealthy",
            f"replica {replica.tag}: health check {replica.checks.failures}/{threshold} "
            f"failed: {error}",
        )
        self._failed.append(
            ReplicaFailure(
                replica.tag,
                replica.version,
                error,
                replica.ready_at,
                trio.current_time(),
                checks_failed=replica.checks.failures,
            )
        )

    # -- stops --

    def begin_stop(self, replica: Replica, *, graceful: bool) -> None:
        if self._set.begin_stop(replica, graceful=graceful):
            self._snapshot.changed()  # out of the watch snapshot before it is asked to drain
        logger.info("replica %s STOPPING (%s)", replica.tag, "drain" if graceful else "kill")

    def _stop_now(self, replica: Replica, *, graceful: bool) -> None:
        self.begin_stop(replica, graceful=graceful)
        self._stops_due.append(replica)  # its task is the executor's to start
