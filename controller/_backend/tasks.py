"""The tasks a backend's loop starts for its replicas: bring up, reconfigure, check, stop.

Each is a plain function of the runtime, its limits and a `send` callable; each reports with
exactly one event and leaves every decision, a stop included, to the loop. They never see the
backend. A task's own scope carries its timeout; the controller closing cancels it without a
report (the next controller takes over from the store). ``Launcher`` starts them, each once the
intent behind it is durable.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, final

import trio

from .._model.decisions.spec import ReplicaSpec
from .._model.values.errors import ReplicaError
from .._model.values.json_values import JSON
from .._ports.runtime import ReplicaInfo, Runtime, batched_checks, check_each
from . import events as ev
from .intent import Intent
from .replica import Replica

logger = logging.getLogger("controller")

Send = Callable[[ev.Event], None]

#: How long a kill may take before the controller gives up on it (and logs it). Kills are shielded
#: from cancellation, so this bound is what keeps a stuck runtime from hanging a shutdown.
KILL_TIMEOUT_S = 30.0


async def bring_up(
    runtime: Runtime, tag: str, spec: ReplicaSpec | None, scope: trio.CancelScope, send: Send
) -> None:
    """Start (or, without a spec, adopt) a replica within `scope`, whose deadline is its start
    timeout. Reports Started, or StartFailed (with no error if `scope` was cancelled)."""
    error: str | None = None
    traceback: str | None = None
    with scope:
        try:
            if spec is None:
                result = await runtime.adopt_replica(tag)
            else:
                result = await runtime.start_replica(spec)
        except ReplicaError as exc:
            error, traceback = exc.summary, exc.traceback
        except Exception as exc:
            # A runtime that fails this way is broken for this replica, not for the others.
            logger.exception("runtime error starting %s", tag)
            error = f"{type(exc).__name__}: {exc}"
        else:
            info = result if isinstance(result, ReplicaInfo) else ReplicaInfo(result)
            send(ev.Started(tag, info))
            return
    send(ev.StartFailed(tag, error, traceback))


async def reconfigure(
    runtime: Runtime,
    tag: str,
    user_config: JSON,
    config_digest: str,
    scope: trio.CancelScope,
    send: Send,
) -> None:
    """Hand a running replica a user config within `scope`. Reports Reconfigured."""
    error: str | None = None
    with scope:
        try:
            await runtime.reconfigure_replica(tag, user_config)
        except ReplicaError as exc:
            error = exc.summary
        except Exception as exc:
            logger.exception("runtime error reconfiguring %s", tag)
            error = f"{type(exc).__name__}: {exc}"
    send(ev.Reconfigured(tag, config_digest, error, cut=scope.cancelled_caught))


async def checks(runtime: Runtime, tags: list[str], limit_s: float, send: Send) -> None:
    """Run one wave of health checks (of replicas due together), bounded by `limit_s`. Reports
    HealthChecked for those that end together, as they end, and for the rest at the deadline.

    A runtime with ``check_health_replicas`` takes the whole wave in one call; any other gets a
    task a check (``check_each``). Either way the wave shares one deadline, and the checks that
    answer together are one event: a check is the commonest thing a backend at rest does."""
    unanswered = dict.fromkeys(tags)

    def report(results: list[tuple[str, Exception | None]]) -> None:
        out: list[tuple[str, str | None]] = []
        for tag, exc in results:
            if tag in unanswered:
                del unanswered[tag]
                out.append((tag, None if exc is None else _check_error(tag, exc)))
        if out:
            send(ev.HealthChecked(out))

    batched = batched_checks(runtime)
    with trio.move_on_after(limit_s):
        try:
            if batched is not None:
                await batched.check_health_replicas(tags, report)
            else:
                await check_each(runtime, tags, report)
        except Exception as exc:
            # A bug in the runtime's batch, not in the replicas: every check left fails with it
            # (said once in the log, not once a replica).
            logger.exception("runtime error checking the health of %d replicas", len(unanswered))
            error = f"{type(exc).__name__}: {exc}"
            send(ev.HealthChecked([(tag, error) for tag in unanswered]))
            unanswered.clear()
    late = f"HealthCheckTimeout: no answer within health_check_timeout_s={limit_s:g}"
    if unanswered:
        send(ev.HealthChecked([(tag, late) for tag in unanswered]))


def _check_error(tag: str, exc: Exception) -> str:
    if isinstance(exc, ReplicaError):
        return exc.summary
    # A bug in the runtime, not in the replica: say where, then count it as failed.
    logger.error("runtime error checking the health of %s", tag, exc_info=exc)
    return f"{type(exc).__name__}: {exc}"


async def stops(
    runtime: Runtime,
    tags: list[str],
    grace_s: float | None,
    drain_scope: trio.CancelScope,
    send: Send,
) -> None:
    """Stop a wave of replicas (those stopped together, with the same grace): drain each within
    `grace_s` (none if None), in `drain_scope`, which a forced delete cancels, then kill it.
    Reports Stopped for each, once it is killed (or its kill failed or timed out).

    The wave shares one drain deadline and scope, and one shielded scope for its kills: a
    scale-down of 100,000 stops 100,000 at once, and a replica then costs two tasks (its drain,
    its kill) instead of a task and two scopes of its own: in trio alone, about 31 us instead
    of 45 on the benchmark's machine."""
    kills = _Kills(runtime, send)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(kills.run)
        try:
            if grace_s is None or grace_s <= 0:
                for tag in tags:
                    kills.kill(tag)
            else:
                await _drains(runtime, tags, grace_s, drain_scope, kills.kill)
        finally:
            kills.close()


async def _drains(
    runtime: Runtime,
    tags: list[str],
    grace_s: float,
    scope: trio.CancelScope,
    kill: Callable[[str], None],
) -> None:
    """Drain each of `tags` within `grace_s`, in `scope`, and hand each to `kill` as soon as its
    drain ends: finished, failed, or cut short by `scope` (its deadline, a forced delete). One
    cut short by the controller closing is left as it is, draining, as a crash would leave it:
    the next controller finishes its stop."""
    deadline = trio.current_time() + grace_s
    scope.deadline = min(scope.deadline, deadline)

    async def one(tag: str) -> None:
        ended = False
        try:
            await runtime.drain_replica(tag)
            ended = True
        except Exception as exc:
            ended = True
            logger.warning("replica %s: drain failed (%s); killing it now", tag, exc)
        finally:
            if ended or scope.cancel_called:
                if not ended and trio.current_time() >= deadline:
                    logger.info("replica %s: drain not done within %gs; killing it", tag, grace_s)
                kill(tag)

    with scope:
        async with trio.open_nursery() as nursery:
            for tag in tags:
                nursery.start_soon(one, tag)


async def kill_replica(runtime: Runtime, tag: str) -> None:
    """Kill one replica alone (an orphan found at recovery), shielded and bounded as a wave's
    kills are (``_Kills``)."""
    with trio.move_on_after(KILL_TIMEOUT_S, shield=True) as scope:
        try:
            await runtime.kill_replica(tag)
        except Exception:
            logger.exception("replica %s: kill failed", tag)
    if scope.cancelled_caught:
        logger.error("replica %s: kill did not finish within %gs", tag, KILL_TIMEOUT_S)


@final
class _Kills:
    """The kills of a wave of stops, each in a task of its own, all in one shielded scope: a kill
    that has begun finishes even when the controller is closing, so no replica is left
    half-stopped; and the scope is bounded, KILL_TIMEOUT_S after the wave's last kill began, so
    a stuck runtime cannot hang a close for longer. Kills are handed in (`kill`) until `close`."""

    def __init__(self, runtime: Runtime, send: Send):
        self._runtime = runtime
        self._send = send
        self._nursery: trio.Nursery | None = None
        self._queued: list[str] = []
        """Handed in before `run` opened its nursery."""
        self._unfinished: set[str] = set()
        self._last_at = -math.inf
        self._closed = trio.Event()

    def kill(self, tag: str) -> None:
        self._unfinished.add(tag)
        self._last_at = trio.current_time()
        if self._nursery is None:
            self._queued.append(tag)
        else:
            self._nursery.start_soon(self._one, tag)

    def close(self) -> None:
        """No more kills will be handed in."""
        self._closed.set()

    async def run(self) -> None:
        with trio.CancelScope(shield=True) as scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for tag in self._queued:
                    nursery.start_soon(self._one, tag)
                self._queued = []
                await self._closed.wait()
                scope.deadline = self._last_at + KILL_TIMEOUT_S
        for tag in self._unfinished:
            logger.error("replica %s: kill did not finish within %gs", tag, KILL_TIMEOUT_S)
            self._send(ev.Stopped(tag))

    async def _one(self, tag: str) -> None:
        try:
            await self._runtime.kill_replica(tag)
        except Exception:
            logger.exception("replica %s: kill failed", tag)
        self._unfinished.discard(tag)
        self._send(ev.Stopped(tag))


Task = Callable[..., Coroutine[Any, Any, None]]


@final
class Launcher:
    """Starts a backend's replica tasks, each one once the intent behind it is durable. It
    reads the replicas it is handed; it writes nothing of them.

    Replica tasks run in waves: a nursery inside the backend's, open while any of its tasks
    runs, and a new one for the next task once it has closed. Trio keeps a nursery's sets of
    tasks and scopes at the largest size they reached, so a backend that started 10,000
    replicas at once in its own nursery would hold that much for good (~250 bytes a replica);
    a wave's are freed with it.

    It holds each replica's live cancel scope (the record holds only what is stored and
    shown): the scope of its start, adoption or reconfigure, from when it is asked for (so that
    a stop decided before the task runs cancels it) until the loop has heard how it ended.
    Stops are not per replica: those made durable together run as one wave (``stops``), with
    one drain scope, held here until the wave ends, for a forced delete to cut."""

    def __init__(self, runtime: Runtime, intent: Intent, send: Send):
        self._runtime = runtime
        self._intent = intent
        self._send = send
        self.nursery: trio.Nursery | None = None
        self._wave: trio.Nursery | None = None
        self._waiting: list[tuple[Task, tuple[object, ...]]] | None = None
        """Tasks asked for while the next wave opens."""
        self._in_flight: dict[str, trio.CancelScope] = {}
        self._stopping: dict[float | None, list[str]] = {}
        """Stops made durable, for the next wave of stops, by their grace (None: no drain)."""
        self._drains: set[trio.CancelScope] = set()
        """The drain scopes of the waves of stops under way."""

    def _start(self, fn: Task, *args: object) -> None:
        if self._wave is not None:
            try:
                self._wave.start_soon(fn, *args)
                return
            except RuntimeError:
                # Its last task has just returned: trio closes a nursery to new tasks then,
                # before its `async with` ends.
                self._wave = None
        if self._waiting is None:
            assert self.nursery is not None, "the backend's task is not running"
            self._waiting = []
            self.nursery.start_soon(self._run_wave)
        self._waiting.append((fn, args))

    async def _run_wave(self) -> None:
        async with trio.open_nursery() as wave:
            waiting, self._waiting = self._waiting or [], None
            for fn, args in waiting:
                wave.start_soon(fn, *args)
            self._wave = wave
        if self._wave is wave:
            self._wave = None

    def start_task(self, fn: Task, *args: object) -> None:
        """Run `fn` in the backend's nursery now (for work that acts on nothing stored)."""
        assert self.nursery is not None, "the backend's task is not running"
        self.nursery.start_soon(fn, *args)

    def stop(self, replica: Replica, grace_s: float) -> None:
        """Stop `replica`: cancel what is in flight for it (its task then reports, and the loop
        calls this again), or drain (if graceful) and kill it."""
        in_flight = self._in_flight.get(replica.tag)
        if in_flight is not None:
            self._intent.act(in_flight.cancel)
            return
        self._intent.act(partial(self._stop_soon, replica, grace_s))

    def _stop_soon(self, replica: Replica, grace_s: float) -> None:
        # Whether it drains is read now, not at the decision: a forced delete since then has
        # made it ungraceful (``ReplicaSet.cut_drains``).
        grace = grace_s if replica.graceful and grace_s > 0 else None
        if not self._stopping:
            # The wave's task runs once every action made durable with this one has run, so it
            # takes them all.
            self._start(self._stop_wave)
        self._stopping.setdefault(grace, []).append(replica.tag)

    async def _stop_wave(self) -> None:
        waves, self._stopping = self._stopping, {}
        if len(waves) == 1:
            ((grace, tags),) = waves.items()
            await self._stops(tags, grace)
            return
        async with trio.open_nursery() as nursery:
            for grace, tags in waves.items():
                nursery.start_soon(self._stops, tags, grace)

    async def _stops(self, tags: list[str], grace: float | None) -> None:
        scope = trio.CancelScope()
        self._drains.add(scope)
        try:
            await stops(self._runtime, tags, grace, scope, self._send)
        finally:
            self._drains.discard(scope)

    def bring_up(self, replica: Replica, spec: ReplicaSpec | None, timeout_s: float) -> None:
        """Start (with a spec) or adopt `replica`, within `timeout_s` of asking the runtime."""
        scope = self._in_flight[replica.tag] = trio.CancelScope()

        def go() -> None:
            # The timeout counts from when the runtime is asked, not from the decision.
            scope.deadline = min(scope.deadline, trio.current_time() + timeout_s)
            self._start(bring_up, self._runtime, replica.tag, spec, scope, self._send)

        self._intent.act(go)

    def reconfigure(
        self, replica: Replica, user_config: JSON, config_digest: str, timeout_s: float
    ) -> None:
        scope = self._in_flight[replica.tag] = trio.CancelScope()

        def go() -> None:
            scope.deadline = min(scope.deadline, trio.current_time() + timeout_s)
            self._start(
                reconfigure,
                self._runtime,
                replica.tag,
                user_config,
                config_digest,
                scope,
                self._send,
            )

        self._intent.act(go)

    def ended(self, tag: str) -> None:
        """The loop has heard how `tag`'s start, adoption or reconfigure ended."""
        self._in_flight.pop(tag, None)

    def gone(self, tag: str) -> None:
        """`tag` is stopped and forgotten."""
        self._in_flight.pop(tag, None)

    def cut_drains(self) -> None:
        """Cut short every drain under way, and drain none of the stops waiting for their wave:
        their kills follow at once (a forced delete)."""
        for scope in self._drains:
            scope.cancel()
        if any(grace is not None for grace in self._stopping):
            tags = [tag for wave in self._stopping.values() for tag in wave]
            self._stopping = {None: tags}

    def checks(self, tags: list[str], timeout_s: float) -> None:
        self._start(checks, self._runtime, tags, timeout_s, self._send)

    def timer(self, scope: trio.CancelScope, when: float) -> None:
        """Wake the loop at `when` (with a Tick), unless `scope` is cancelled first."""
        # Not in a wave: a timer is always set while checks are due, and would keep it open.
        self.start_task(_tick, scope, when, self._send)


@final
class Alarm:
    """The loop's one timer task: it wakes the loop (a Tick) at the earliest time asked of it
    since it last rang, which is all the loop needs: each pass asks again."""

    def __init__(self, launcher: Launcher):
        self._launcher = launcher
        self._at = math.inf
        self._scope: trio.CancelScope | None = None

    def ask(self, when: float) -> None:
        if when >= self._at:
            return  # it rings earlier (or on time) anyway; that pass asks again
        if self._scope is not None:
            self._scope.cancel()
        self._at = when
        self._scope = trio.CancelScope()
        self._launcher.timer(self._scope, when)

    def rang(self, at: float) -> None:
        if at == self._at:  # not a stale tick of a timer since replaced
            self._at, self._scope = math.inf, None


async def _tick(scope: trio.CancelScope, when: float, send: Send) -> None:
    with scope:
        await trio.sleep_until(when)
        send(ev.Tick(when))
