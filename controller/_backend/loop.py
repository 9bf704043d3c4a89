"""One backend: its task, its nursery, its replicas and its reconcile loop.

The loop is the only writer of the backend's state. A spec change arrives as an event with its goal;
every start, adoption, reconfigure, health check and stop runs as a task in the backend's nursery
and reports with one event (``tasks``). The loop wakes on its channel, applies every queued event
(``reduce``), reads what its pass needs, asks the pure ``decide_pass`` for a plan
(``_model.decisions.pass_plan``), publishes the watch snapshot, and carries the plan out through its
helpers, each action once the intent behind it is durable (``intent``). It decides every stop
itself.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import final

import trio

from .._clock import wall_now
from .._model.decisions.failures import FailureBook
from .._model.decisions.pass_plan import PassState, decide_pass
from .._model.decisions.spec import Spec
from .._model.records.code_report import CodeReport
from .._model.records.multiplexing import Held
from .._model.records.records import events_key, replicas_key, revisions_key, spec_key
from .._model.records.replica_state import ReplicaState
from .._model.records.revisions import RevisionBook
from .._model.values.json_values import JSON
from .._model.views.status import BackendReason, BackendState, LoadReport
from . import events as ev
from . import tasks as tasks
from . import view as view
from .canary import Canary
from .failure_reports import FailureReports
from .goal import Goal
from .health import HealthChecks
from .history import Journal
from .intent import Intent
from .reading import Reading
from .reduce import Reducer
from .replica import Replica, new_tag
from .replica_set import ReplicaSet
from .rollout import Rollout
from .scaling import Scaling
from .settle import GoalSettler, unfinished
from .shared import Shared

logger = logging.getLogger("controller")
#: The events of load: a pass for them alone leaves the autoscaler's count unchanged if its
#: evaluation does.
_OF_LOAD = (ev.LoadReported, ev.OwnLoad)


@final
class Backend(Reducer, Reading):
    """A backend's state and its task. Made by the controller; ``run`` is the task."""

    def __init__(
        self,
        name: str,
        spec: Spec,
        goal: Goal,
        lock: trio.Lock,
        shared: Shared,
        revisions: RevisionBook,
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
        self._shared = shared
        # Unbounded, and that is safe: every event answers a task the loop itself started (one
        # each), a death (at most one per replica) or a spec change (one per deploy). Senders
        # must never block: some of them run in the runtime's own callbacks.
        self._send, self._receive = trio.open_memory_channel[ev.Event](math.inf)
        self._failures = FailureBook(shared.policy, shared.rng)
        self._change: tuple[BackendState, BackendReason] = view.classify(spec, spec)
        self._observed_generation = 0
        self._converged = False
        self._snapshot_dirty = True
        self._held: dict[str, Held] = {}
        """What each multiplexed replica said it holds, for the snapshot."""
        self._held_published_at = -math.inf
        self._held_due = False  # a timer brings a pass once HELD_PUBLISH_S is past
        self.journal = Journal(name, shared.observer, lambda: self._intent.events_changed())
        self._intent = Intent(
            name,
            shared.store,
            self._set.record,
            self.journal.log,
            self._send_nowait,
            shared.turns,
        )
        self._tasks = tasks.Launcher(shared.runtime, self._intent, self._send_nowait)
        self._alarm = tasks.Alarm(self._tasks)
        self._settler = GoalSettler(
            self._intent, lambda: any(map(unfinished, self.replicas.values()))
        )
        self._reports = FailureReports(
            self._failures,
            self.journal,
            self._set,
            lambda: (self.spec.generation, self.goal),
            self._settler,
            self._rollout_failed,
        )
        self.revisions = revisions
        """Its revisions, read here: the desk adds them, and marks what the rollout reports."""
        self._rollout = Rollout(
            name,
            revisions,
            self.journal,
            touched=self._intent.touched,
            spec=lambda: self.spec,
            failures=self._failures,
            deploy_failed=self._reports.deploy_failed,
            roll_back=shared.roll_back,
            report=functools.partial(shared.report_outcome, name),
            observer=shared.observer,
            in_canary=lambda: self._canary.phase in ("judging", "aborted"),
        )
        self._canary = Canary(
            revisions,
            self.journal,
            touched=self._intent.touched,
            published=self._traffic_changed,
            fail=lambda why: self._reports.deploy_failed("CanaryAborted", why),
            progressed=self._rollout.progressed,
            promoted=lambda: shared.on_promoted(name),
            phase_of=shared.canary_phase,
        )
        self._set.rollout = lambda: self._canary.recorded(self._rollout.record())
        self._restored = False
        self._health = HealthChecks(
            self._tasks,
            self._check_failed,
            self._ready_changed,
            late=lambda n: shared.observer.late_checks(name, n),
            mark=self._set.mark,
        )
        self._load_only = False  # the events of this pass were all of load
        self._scaling = Scaling(
            name,
            room=shared.room,
            observer=shared.observer,
            intent=self._intent,
            journal=self.journal,
            start_task=self._tasks.start_task,
            send=self._send_nowait,
        )
        self._set.autoscale = self._scaling.record
        self._scaling.configure(spec.backend_config, trio.current_time())
        self.journal.event("Delete" if spec.deleting else "Deploy", view.describe_new(spec))

    # -- called by the controller: it reads, and it sends events --

    def request(self, spec: Spec, goal: Goal) -> trio.Event:
        """Hand the loop a spec that is durable already, with its goal; the event returned is
        set once the loop has taken it."""
        applied = trio.Event()
        self._send_nowait(ev.SpecChanged(spec, goal, applied))
        return applied

    def notify_died(self, tag: str, reason: str, *, node: str | None = None) -> None:
        """`tag` died on its own, or went with its lost `node`."""
        self._send_nowait(ev.Died(tag, reason, node))

    def notify_nodes(self) -> None:
        self._send_nowait(ev.NodesChanged())

    def steer_canary(self, what: str, via: str) -> trio.Event:
        """Promote or abort the canary under way; the event returned is set once the loop
        has done it."""
        applied = trio.Event()
        self._send_nowait(ev.CanaryCommand(what, via, applied))
        return applied

    def report_load(self, report: LoadReport) -> None:
        """A source's latest load, for the loop to keep (its load book and its canary's numbers
        have one writer, the loop: status shows the report once the loop has taken it)."""
        self._send_nowait(ev.LoadReported(report, trio.current_time()))

    def report_replica_load(
        self,
        tag: str,
        ongoing: int | None,
        served: int | None = None,
        code: CodeReport | None = None,
    ) -> None:
        """What a replica of this backend says of its own load (its ``load()``; None: it no
        longer says), of the requests it has answered (code the worker serves), and of its
        models and batches (``CodeReport``), for the loop to keep."""
        self._send_nowait(ev.OwnLoad(tag, ongoing, served, code))

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
            self._health.adopting(self.replicas, self.spec.backend_config)
            self._publish()  # watchers see the replicas that served before `open` returns
            if not self._restored and not self.spec.deleting:
                self._rollout.begin(self.spec.revision, trio.current_time())
            task_status.started()
            self._rollout.started()
            done = await self._pass()
            while not done:
                event = await self._receive.receive()
                taken_at = trio.current_time()  # the wait for a turn counts in the latency
                # A turn of the loop's: it also lets the tasks just started (and watchers just
                # woken) run first, so a burst of events is coalesced, not handled a pass each.
                await self._shared.turns.take()
                handled = 0
                # Coalesce a burst: one pass for everything already queued, and none if it
                # changed nothing a pass decides on (checks passing: a backend at rest).
                self._load_only = True
                quiet = True
                while True:
                    self._load_only &= isinstance(event, _OF_LOAD)
                    quiet = self._apply(event) and quiet
                    handled += 1
                    try:
                        event = self._receive.receive_nowait()
                    except trio.WouldBlock:
                        break
                if not quiet:
                    done = await self._pass()
                elapsed = trio.current_time() - taken_at
                self._shared.observer.events_handled(self.name, handled, elapsed)
                self._shared.on_pass()
            # Forgotten: no replica is left, so the only task still here is the idle writer.
            nursery.cancel_scope.cancel()
        self._shared.observer.forgotten(self.name)  # after its last pass is counted

    def _send_nowait(self, event: ev.Event) -> None:
        self._send.send_nowait(event)

    def _traffic_changed(self) -> None:
        self._snapshot_dirty = True

    def _rollout_failed(self, reason: str) -> str:
        if self._canary.phase == "judging":
            self._canary.abort()  # weight 0 now, whatever failed it
        return self._rollout.failed(reason)

    # -- one pass --

    async def _pass(self) -> bool:
        """Read, decide, publish, act. True once a deleted backend is gone for good."""
        spec, config, now = self.spec, self.spec.backend_config, trio.current_time()
        config_digest, user_config = self._config_to_hold()
        serving = self._set.serving_of.get(spec.version, 0)
        canary_at = self._canary.look(spec, now, serving, self.desired)
        self._publish()  # a new weight reaches the ingresses before replicas move
        state = self._read(now, config_digest, user_config is not None, canary_at)
        plan = decide_pass(state, now)
        if plan.deadline_failure is not None:
            self._reports.deploy_failed("ProgressDeadlineExceeded", plan.deadline_failure)
        self._scaling.tell()
        if plan.replicas is None:
            # New load and the same count: nothing else moved, so the plan is the last one (a
            # backend of 10,000 replicas is not walked ten times a second).
            self._alarm.ask(plan.wake(self._failures.backoff_until))
            return False
        self._observed_generation = spec.generation
        self._converged = plan.converged
        if plan.converged:
            self._scaling.converged()
            if self._failures.blocked is None and not self._set.unhealthy and not spec.deleting:
                # Else a failure long mended reads as news.
                self.journal.healthy()
                self._failures.mended()
        if plan.complete:
            self._rollout.complete(plan.num_replicas)

        stops = [self.replicas[tag] for tag in plan.replicas.stop]
        for replica in stops:
            graceful = not spec.force and replica.state is not ReplicaState.STARTING
            self._begin_stop(replica, graceful=graceful)
        starts = [
            self._set.add(
                new_tag(self.name, self.replicas),
                spec.version,
                config_digest,
                revision=spec.revision,
            )
            for _ in range(plan.replicas.start)
        ]
        if plan.replicas.start_stable and state.split is not None:
            stable = state.split
            starts += [
                self._set.add(
                    new_tag(self.name, self.replicas),
                    stable.stable_version,
                    stable.stable_digest,
                    revision=self._canary.stable_number,
                )
                for _ in range(plan.replicas.start_stable)
            ]
        updates = [self.replicas[tag] for tag in plan.replicas.reconfigure]
        if user_config is None:
            # Only a config that is not None is handed to replicas (new ones get none either):
            # those that had one are up to date as they are.
            for replica in updates:
                self._set.set_config(replica, config_digest)
            updates = []
        for replica in updates:
            self._set.mark(replica, state=ReplicaState.UPDATING)

        # Watchers first: a replica leaves the snapshot before it is asked to drain.
        self._publish()
        for replica in stops:
            self._spawn_stop(replica)
        for replica in starts:
            self._spawn_bring_up(replica, adopt=False)
        for replica in updates:
            self._tasks.reconfigure(replica, user_config, config_digest, config.start_timeout_s)
        started = [r.version for r in starts]
        self.journal.decision(spec.version, started, [r.version for r in stops], len(updates))
        self._health.carry_out(plan, now, self.replicas, config)
        self._publish()  # a late health check may have taken a replica out
        # The backoff as the plan left it: a late check at its threshold backs off.
        self._alarm.ask(plan.wake(self._failures.backoff_until))
        if plan.forget:
            return await self._forget()
        # Converged, and not within a new replica's min_ready_s: complete once stored.
        if plan.reached and not self._settler.resolving(self.goal):
            self.journal.reached(spec.generation)
            self._settler.resolve(self.goal, Goal.complete)
        return False

    def _read(
        self, now: float, config_digest: str, hands_config: bool, canary_at: float
    ) -> PassState:
        """What the pass decides on. The autoscaler is evaluated and its count fitted here:
        both are state that evaluating updates (``_model.decisions.pass_plan``)."""
        census, version = self._set.census, self.spec.version
        autoscaled = self._scaling.autoscaled and not self.spec.deleting
        # Replicas not serving yet count as fully loaded before it scales down (asked lazily).
        changed = autoscaled and self._scaling.evaluate(now, lambda: census.not_ready(version))
        unchanged = autoscaled and self._load_only and not changed
        held = census.total - census.count(ReplicaState.STOPPING)
        count = self._scaling.count(held, now) if autoscaled and not unchanged else None
        if not autoscaled:
            self._scaling.not_autoscaled()
        return PassState(
            spec=self.spec,
            config_digest=config_digest,
            hands_config=hands_config,
            blocked=self._failures.blocked,
            backoff_until=self._failures.backoff_until,
            converged=self._converged,
            rollout=self._rollout.state(),
            autoscaled=autoscaled,
            count=count,
            unchanged=unchanged,
            asking_room=self._scaling.asking_room,
            scaling_at=self._scaling.next_at,
            health=self._health.read(now, self.replicas, take=not unchanged),
            replicas=self.replicas.values(),
            census=census,
            evict=self._shared.nodes.evict,
            evict_now=self._shared.nodes.evict_now,
            split=self._canary.split(self.spec, self.desired),
            canary_at=canary_at,
        )

    def _config_to_hold(self) -> tuple[str, JSON]:
        return self.spec.config_to_hold(rolled_back=self._failures.blocked == "ReconfigureFailed")

    @property
    def desired(self) -> int:
        """The replica count it moves to: the autoscaler's (as far as it fits), or the
        config's."""
        return self._scaling.desired(self.spec.backend_config.num_replicas)

    # -- replicas --

    def _spawn_stop(self, replica: Replica) -> None:
        grace = self.spec.backend_config.graceful_shutdown_timeout_s
        if replica.resumed_stop and replica.stopping_since is not None:
            # A stop begun before (by a controller that crashed or lost its lease): only what
            # is left of its deadline, or a takeover after another would drain for ever.
            grace = max(0.0, replica.stopping_since + grace - wall_now())
        self._tasks.stop(replica, grace)

    def _spawn_bring_up(self, replica: Replica, *, adopt: bool) -> None:
        spec = None
        if not adopt:
            user_config = self._config_to_hold()[1]
            of = self.spec
            stable = self._canary.stable
            if replica.version != of.version and stable is not None:
                # A replica of the stable revision, beside a canary: its content.
                of, user_config = of.running(stable.content), stable.content.user_config
            spec = of.replica_spec(self.name, replica.tag, replica.version, user_config)
        self._tasks.bring_up(replica, spec, self.spec.backend_config.start_timeout_s)

    def _publish(self) -> None:
        if self._snapshot_dirty:
            self._snapshot_dirty = False
            hub = self._shared.hub
            hub.publish(
                view.snapshot_of(
                    self.name,
                    hub.next_id(),
                    self.spec,
                    self._set.serving,
                    self.forgotten,
                    self._canary.traffic(self.spec),
                    self._held,
                )
            )

    async def _forget(self) -> bool:
        if not self._intent.idle:
            return False  # a write is in flight or due; its Written event brings another pass
        async with self.lock:
            if self._shared.requested(self.name) != self.spec.generation or self.replicas:
                return False  # a deploy came in while we waited for the lock: its spec is next
            name = self.name
            keys = [spec_key(name), replicas_key(name), events_key(name), revisions_key(name)]
            await self._intent.forget(keys + self._set.page_keys())
            self.forgotten = True
            self._snapshot_dirty = True
            self._publish()
            self.goal.complete()
            self._shared.on_forgotten(self)
            logger.info("backend %s deleted", self.name)
            return True
