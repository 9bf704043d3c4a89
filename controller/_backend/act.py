"""The act step of a backend's pass: it carries out the replica plan that ``decide_pass``
returned, and the verdicts of ``judge_failures`` on the failures the reducer recorded, and decides
nothing.

What the plan stops, starts and reconfigures is marked first (the replica set records it, so
the intent behind each task is durable before the task acts), watchers are told, and only then
are the tasks started: a replica leaves the watch snapshot before it is asked to drain."""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from .._clock import wall_now
from .._model.decisions.canary_plan import CanarySplit
from .._model.decisions.failures import FailureVerdict, ReconfigureFailure, StartFailure
from .._model.decisions.pass_plan import PassPlan
from .._model.records.replica_state import ReplicaState
from .._model.values.json_values import JSON
from . import tasks as tasks
from .failure_reports import FailureReports
from .health import HealthChecks
from .loop_state import LoopState
from .reduce import Due, Reducer
from .replica import Replica, new_tag
from .snapshot import Snapshot


class Executor:
    def __init__(
        self,
        state: LoopState,
        snapshot: Snapshot,
        reducer: Reducer,
        tasks: tasks.Launcher,
        health: HealthChecks,
        reports: FailureReports,
        *,
        roll_back: Callable[[int], None],
    ):
        self._state = state
        self._snapshot = snapshot
        self._reducer = reducer
        self._tasks = tasks
        self._health = health
        self._reports = reports
        self._roll_back = roll_back

    def roll_back(self, failed: int | None) -> None:
        """Ask the controller to undo revision `failed` (None: no rollback is due), in its own
        nursery: the spec is the controller's to write."""
        if failed is not None:
            self._roll_back(failed)

    def carry_out(
        self, plan: PassPlan, split: CanarySplit | None, config: tuple[str, JSON]
    ) -> None:
        """The plan's replica moves and health checks (``plan.replicas`` is not None), with what
        the pass read: the split (the stable revision a canary's plan starts replicas of) and
        the user config (digest, value) the replicas are to hold."""
        assert plan.replicas is not None
        state, replica_set = self._state, self._state.set
        replicas, spec = replica_set.by_tag, state.spec
        config_digest, user_config = config
        stops = [replicas[tag] for tag in plan.replicas.stop]
        for replica in stops:
            graceful = not spec.force and replica.state is not ReplicaState.STARTING
            self._reducer.begin_stop(replica, graceful=graceful)
        starts = [
            replica_set.add(
                new_tag(state.name, replicas),
                spec.version,
                config_digest,
                revision=spec.revision,
            )
            for _ in range(plan.replicas.start)
        ]
        if plan.replicas.start_stable and split is not None:
            starts += [
                replica_set.add(
                    new_tag(state.name, replicas),
                    split.stable_version,
                    split.stable_digest,
                    revision=state.canary.stable_number,
                )
                for _ in range(plan.replicas.start_stable)
            ]
        updates = [replicas[tag] for tag in plan.replicas.reconfigure]
        if user_config is None:
            # Only a config that is not None is handed to replicas (new ones get none either):
            # those that had one are up to date as they are.
            for replica in updates:
                replica_set.set_config(replica, config_digest)
            updates = []
        for replica in updates:
            replica_set.mark(replica, state=ReplicaState.UPDATING)

        # Watchers first: a replica leaves the snapshot before it is asked to drain.
        self._snapshot.publish()
        timeout_s = spec.backend_config.start_timeout_s
        for replica in stops:
            self.start_stop(replica)
        for replica in starts:
            self.bring_up(replica, adopt=False)
        for replica in updates:
            self._tasks.reconfigure(replica, user_config, config_digest, timeout_s)
        started = [r.version for r in starts]
        state.journal.decision(spec.version, started, [r.version for r in stops], len(updates))
        self._health.carry_out(plan, plan.now, replicas, spec.backend_config)
        self._snapshot.publish()  # a late health check may have taken a replica out

    def act_on(self, due: Due) -> None:
        """Start what the reducer left to do."""
        for replica in due.stops:
            self.start_stop(replica)
        if due.cut_drains:
            self._tasks.cut_drains()
        if due.tick_at < math.inf:
            # A timer of its own: the loop's alarm is the pass's, which asks it afresh each time.
            self._tasks.timer(trio.CancelScope(), due.tick_at)

    def act_on_failures(self, verdicts: list[FailureVerdict]) -> None:
        """What each failure does, in the order they came: the deploy fails, the canary is
        aborted, the replica is replaced (a dead one is being stopped already) with a backoff
        before the next start, or kept out of the snapshot until a check passes."""
        for verdict in verdicts:
            failure = verdict.failure
            if isinstance(failure, StartFailure):
                self._reports.start_failed(failure, verdict.fails_rollout)
                continue
            if isinstance(failure, ReconfigureFailure):
                said, kind = f"reconfigure failed: {failure.error}", "ReconfigureFailed"
                if verdict.fails_rollout is not None:
                    # The replicas not reconfigured yet keep the config before; this one is
                    # taken back to it by the plan (or replaced with it if that fails too).
                    back = "taking it back to the config before"
                    self._reports.failure(failure.tag, kind, said, then=back)
                    self._reports.deploy_failed("ReconfigureFailed", verdict.fails_rollout)
            else:
                said = failure.what if failure.died else f"unhealthy: {failure.error}"
                kind = "Died" if failure.died else "Unhealthy"
                if verdict.fails_rollout is not None:
                    self._reports.deploy_failed("UnhealthyAfterReady", verdict.fails_rollout)
                if verdict.aborts_canary:
                    self._state.canary.replica_failed(failure.tag, said)
                if not verdict.replaced:
                    self._state.journal.unhealthy(failure.error)
            if verdict.replaced:
                self._reports.failure(failure.tag, kind, said)
                self._replace(failure.tag)

    def _replace(self, tag: str) -> None:
        replica = self._state.set.by_tag.get(tag)
        if replica is not None and replica.state is not ReplicaState.STOPPING:
            self._reducer.begin_stop(replica, graceful=True)
            self.start_stop(replica)

    def start_stop(self, replica: Replica) -> None:
        """Start the stop task of `replica`, marked STOPPING already."""
        grace = self._state.spec.backend_config.graceful_shutdown_timeout_s
        if replica.resumed_stop and replica.stopping_since is not None:
            # A stop begun before (by a controller that crashed or lost its lease): only what
            # is left of its deadline, or a takeover after another would drain for ever.
            grace = max(0.0, replica.stopping_since + grace - wall_now())
        self._tasks.stop(replica, grace)

    def bring_up(self, replica: Replica, *, adopt: bool) -> None:
        """Start `replica`'s start task, or (`adopt`) its adoption of a live replica."""
        spec = None
        state = self._state
        if not adopt:
            user_config: JSON = state.config_to_hold()[1]
            of = state.spec
            stable = state.canary.stable
            if replica.version != of.version and stable is not None:
                # A replica of the stable revision, beside a canary: its content.
                of, user_config = of.running(stable.content), stable.content.user_config
            spec = of.replica_spec(state.name, replica.tag, replica.version, user_config)
        self._tasks.bring_up(replica, spec, state.spec.backend_config.start_timeout_s)
