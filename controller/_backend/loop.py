"""One backend: its task, its nursery, its replicas and its reconcile loop.

The loop is the only writer of the backend's state (``loop_state``). A spec change arrives as an
event with its goal; every start, adoption, reconfigure, health check and stop runs as a task in
the backend's nursery and reports with one event (``tasks``). The loop wakes on its channel,
applies every queued event (``reduce``: it records, and starts no replica task), reads what its pass
needs, asks the pure ``decide_pass`` for a plan (``_model.decisions.pass_plan``), publishes the
watch snapshot (``snapshot``), and has its executor carry the plan out (``act``), each action once
the intent behind it is durable (``intent``). It decides every stop itself.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import final

import trio

from .._model.decisions.canary_steps import look
from .._model.decisions.failures import FailureBook, judge_failures
from .._model.decisions.pass_plan import PassState, decide_pass, decide_scale
from .._model.decisions.spec import Spec
from .._model.records.code_report import CodeReport
from .._model.records.records import (
    EventsRecord,
    ReplicasRecord,
    events_key,
    replicas_key,
    revisions_key,
    spec_key,
)
from .._model.records.replica_state import ReplicaState
from .._model.records.revisions import RevisionBook
from .._model.views.status import LoadReport
from . import events as ev
from . import tasks as tasks
from . import view as view
from .act import Executor
from .canary import Canary
from .failure_reports import FailureReports
from .goal import Goal
from .health import HealthChecks
from .history import Journal
from .intent import Intent
from .loop_state import LoopState
from .reading import Reading
from .reduce import Reducer
from .replica import Replica
from .replica_set import ReplicaSet
from .rollout import Rollout
from .scaling import Scaling
from .settle import GoalSettler, unfinished
from .shared import Shared
from .snapshot import Snapshot

logger = logging.getLogger("controller")
#: The events of load: a pass for them alone leaves the autoscaler's count unchanged if its
#: evaluation does.
_OF_LOAD = (ev.LoadReported, ev.OwnLoad)


@final
class Backend:
    """A backend's state and its task. Made by the controller; ``run`` is the task.

    A composition: its state (``LoopState``) is written by its reducer (``reduce``) as events
    come and by its pass, and read through ``reading``; the parts that keep state of their own
    (the intent, the tasks, the rollout, the health checks, the snapshot) are held here."""

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
        self.lock = lock
        """Held by deploy and delete while they write the spec, and by the loop while it forgets
        a deleted backend, so that a deploy racing a finished delete is never lost."""
        self._shared = shared
        # Unbounded, and that is safe: every event answers a task the loop itself started (one
        # each), a death (at most one per replica) or a spec change (one per deploy). Senders
        # must never block: some of them run in the runtime's own callbacks.
        self._send, self._receive = trio.open_memory_channel[ev.Event](math.inf)
        replica_set = ReplicaSet(name, lambda: self._intent.changed())
        failures = FailureBook(shared.policy, shared.rng)
        journal = Journal(name, shared.observer, lambda: self._intent.events_changed())
        self._intent = Intent(
            name,
            shared.store,
            replica_set.record,
            journal.log,
            self._send_nowait,
            shared.turns,
        )
        self._tasks = tasks.Launcher(shared.runtime, self._intent, self._send_nowait)
        self._alarm = tasks.Alarm(self._tasks)
        self._settler = GoalSettler(
            self._intent, lambda: any(map(unfinished, replica_set.by_tag.values()))
        )
        self._reports = FailureReports(
            failures,
            journal,
            replica_set,
            lambda: (self._state.spec.generation, self._state.goal),
            self._settler,
            self._rollout_failed,
        )
        self._rollout = Rollout(
            name,
            revisions,
            journal,
            touched=self._intent.touched,
            spec=lambda: self._state.spec,
            failures=failures,
            report=functools.partial(shared.report_outcome, name),
            observer=shared.observer,
            in_canary=lambda: canary.phase in ("judging", "aborted"),
        )
        canary = Canary(
            revisions,
            journal,
            touched=self._intent.touched,
            published=lambda: self._snapshot.changed(),
            fail=lambda why: self._reports.deploy_failed("CanaryAborted", why),
            progressed=self._rollout.progressed,
            promoted=lambda: shared.on_promoted(name),
            phase_of=shared.canary_phase,
        )
        replica_set.rollout = lambda: canary.recorded(self._rollout.record())
        scaling = Scaling(
            name,
            room=shared.room,
            observer=shared.observer,
            intent=self._intent,
            journal=journal,
            start_task=self._tasks.start_task,
            send=self._send_nowait,
        )
        replica_set.autoscale = scaling.record
        scaling.configure(spec.backend_config, trio.current_time())
        self._state = LoopState(
            name,
            spec,
            goal,
            revisions,
            journal,
            replica_set,
            failures,
            scaling,
            canary,
            view.classify(spec, spec),
        )
        # Its parts, held here too: each keeps its own state, and none is ever replaced.
        self._set, self._replicas, self._journal = replica_set, replica_set.by_tag, journal
        self._failures, self._scaling, self._canary = failures, scaling, canary
        self.reading = Reading(self._state)
        """What is read of it: its status, its counts, its canary."""
        self._snapshot = Snapshot(self._state, shared.hub)
        self._health = HealthChecks(
            self._tasks,
            lambda replica, error: self._reducer.check_failed(replica, error),
            self._snapshot.changed,
            late=lambda n: shared.observer.late_checks(name, n),
            mark=replica_set.mark,
        )
        self._reducer = Reducer(
            self._state,
            self._snapshot,
            tasks=self._tasks,
            alarm=self._alarm,
            intent=self._intent,
            reports=self._reports,
            rollout=self._rollout,
            health=self._health,
            settler=self._settler,
            shared=shared,
        )
        self._executor = Executor(
            self._state,
            self._snapshot,
            self._reducer,
            self._tasks,
            self._health,
            self._reports,
            roll_back=functools.partial(shared.roll_back, name),
        )
        self._load_only = False  # the events of this pass were all of load
        journal.event("Delete" if spec.deleting else "Deploy", view.describe_new(spec))

    # -- what the controller reads of it (the rest through `reading`) --

    @property
    def spec(self) -> Spec:
        return self._state.spec

    @property
    def goal(self) -> Goal:
        return self._state.goal

    @property
    def replicas(self) -> dict[str, Replica]:
        return self._state.replicas

    @property
    def journal(self) -> Journal:
        return self._state.journal

    @property
    def revisions(self) -> RevisionBook:
        return self._state.revisions

    @property
    def forgotten(self) -> bool:
        return self._state.forgotten

    # -- before the task runs: what the store held --

    def restore(
        self, record: ReplicasRecord | None, live: set[str], events: EventsRecord | None
    ) -> list[str]:
        """Rebuild replicas from a checkpoint, adopting what is alive and forgetting what is
        not (returned, for the runtime to clear what they left behind)."""
        return self._reducer.restore(record, live, events)

    def show_as_stored(self) -> None:
        """For a standby's view (which never runs): as the leader last wrote it."""
        self._reducer.show_as_stored()

    def block_starts(self, reason: str) -> None:
        """Start nothing new until the next deploy: the spec cannot be placed."""
        self._reducer.block_starts(reason)

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
            for replica in list(self._replicas.values()):
                if replica.state is ReplicaState.RECOVERING:
                    self._executor.bring_up(replica, adopt=True)
                elif replica.state is ReplicaState.STOPPING:
                    self._executor.start_stop(replica)
            self._health.adopting(self._replicas, self._state.spec.backend_config)
            self._snapshot.publish()  # watchers see the replicas that served before `open` returns
            if not self._state.restored and not self._state.spec.deleting:
                self._rollout.begin(self._state.spec.revision, trio.current_time())
            task_status.started()
            self._rollout.started()
            done = await self._pass()
            self._executor.roll_back(self._rollout.take_roll_back())
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
                    quiet = self._reducer.apply(event) and quiet
                    self._judge_failures()  # before the next event: it may be a new spec
                    handled += 1
                    try:
                        event = self._receive.receive_nowait()
                    except trio.WouldBlock:
                        break
                self._executor.act_on(self._reducer.take_due())
                if not quiet:
                    done = await self._pass()
                # A rollout that failed in the burst or the pass (an event, its deadline, a late
                # check, the canary's verdict) and is to be undone: undone now.
                self._executor.roll_back(self._rollout.take_roll_back())
                elapsed = trio.current_time() - taken_at
                self._shared.observer.events_handled(self.name, handled, elapsed)
                self._shared.on_pass()
            # Forgotten: no replica is left, so the only task still here is the idle writer.
            nursery.cancel_scope.cancel()
        self._shared.observer.forgotten(self.name)  # after its last pass is counted

    def _send_nowait(self, event: ev.Event) -> None:
        self._send.send_nowait(event)

    def _rollout_failed(self, reason: str) -> str:
        if self._canary.phase == "judging":
            self._canary.abort()  # weight 0 now, whatever failed it
        return self._rollout.failed(reason)

    # -- one pass --

    async def _pass(self) -> bool:
        """Read, decide, publish, act. True once a deleted backend is gone for good."""
        spec, now = self._state.spec, trio.current_time()
        config_digest, user_config = self._state.config_to_hold()
        serving = self._set.serving_of.get(spec.version, 0)
        sight = self._canary.sight(spec, now, serving, self._state.desired)
        canary_at = math.inf if sight is None else self._canary.looked(sight, look(sight))
        self._snapshot.publish()  # a new weight reaches the ingresses before replicas move
        state = self._read(now, config_digest, user_config is not None, canary_at)
        plan = decide_pass(state, now)
        if state.scaled is not None:
            self._scaling.took(state.scaled)
        if plan.deadline_failure is not None:
            self._reports.deploy_failed("ProgressDeadlineExceeded", plan.deadline_failure)
        self._scaling.tell()
        if plan.replicas is None:
            # New load and the same count: nothing else moved, so the plan is the last one (a
            # backend of 10,000 replicas is not walked ten times a second).
            self._alarm.ask(plan.wake(self._failures.backoff_until))
            return False
        self._state.observed_generation = spec.generation
        self._state.converged = plan.converged
        if plan.converged:
            self._scaling.converged()
            if self._failures.blocked is None and not self._set.unhealthy and not spec.deleting:
                # Else a failure long mended reads as news.
                self._journal.healthy()
                self._failures.mended()
        if plan.complete:
            self._rollout.complete(plan.num_replicas)

        self._executor.carry_out(plan, state.split, (config_digest, user_config))
        self._judge_failures()  # the late checks
        # The backoff as the plan left it: a late check at its threshold backs off.
        self._alarm.ask(plan.wake(self._failures.backoff_until))
        if plan.forget:
            return await self._forget()
        # Converged, and not within a new replica's min_ready_s: complete once stored.
        if plan.reached and not self._settler.resolving(self._state.goal):
            self._journal.reached(spec.generation)
            self._settler.resolve(self._state.goal, Goal.complete)
        return False

    def _judge_failures(self) -> None:
        """The verdicts on the failures recorded since the last time, carried out at once."""
        if failures := self._reducer.take_failures():
            judging = self._canary.version if self._canary.phase == "judging" else None
            inputs = self._rollout.failure_inputs(judging)
            self._executor.act_on_failures(judge_failures(failures, inputs))

    def _read(
        self, now: float, config_digest: str, hands_config: bool, canary_at: float
    ) -> PassState:
        """What the pass decides on, with an autoscaled backend's count decided first: a pass
        on load alone that keeps the count takes no health check off the schedule."""
        census, spec = self._set.census, self._state.spec
        scale = None if spec.deleting else self._scaling.scale_input(now)
        scaled = None
        if scale is None:
            self._scaling.not_autoscaled()
        else:
            scaled = decide_scale(scale, census, spec.version, self._load_only, now)
        unchanged = scaled is not None and scaled.unchanged
        # The canary's share is of the count this pass works toward (kept only after the plan).
        count = self._state.desired if scaled is None or scaled.count is None else scaled.count
        return PassState(
            spec=self._state.spec,
            config_digest=config_digest,
            hands_config=hands_config,
            blocked=self._failures.blocked,
            backoff_until=self._failures.backoff_until,
            converged=self._state.converged,
            rollout=self._rollout.state(),
            scaled=scaled,
            health=self._health.read(now, self._replicas, take=not unchanged),
            replicas=self._replicas.values(),
            census=census,
            evict=self._shared.nodes.evict,
            evict_now=self._shared.nodes.evict_now,
            split=self._canary.split(spec, count),
            canary_at=canary_at,
        )

    async def _forget(self) -> bool:
        if not self._intent.idle:
            return False  # a write is in flight or due; its Written event brings another pass
        async with self.lock:
            if self._shared.requested(self.name) != self._state.spec.generation or self._replicas:
                return False  # a deploy came in while we waited for the lock: its spec is next
            name = self.name
            keys = [spec_key(name), replicas_key(name), events_key(name), revisions_key(name)]
            await self._intent.forget(keys + self._set.page_keys())
            self._state.forgotten = True
            self._snapshot.changed()
            self._snapshot.publish()
            self._state.goal.complete()
            self._shared.on_forgotten(self)
            logger.info("backend %s deleted", self.name)
            return True
