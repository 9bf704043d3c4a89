"""FakeRuntime: replicas that a test drives by hand, under trio's MockClock or the real clock."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import NoReturn, final

import trio

from .._model.decisions.placement import SLOTS
from .._model.decisions.spec import ReplicaSpec
from .._model.records.code_report import CodeReport
from .._model.values.errors import FencedError, ReplicaError, ReplicaGoneError
from .._model.values.json_values import JSON
from .._ports.runtime import (
    CheckReport,
    DeathListener,
    ReplicaInfo,
    tell_load,
    tell_lost_with_node,
)
from ._fake_http import reconfigure_code, serve_code
from ._fake_nodes import FakeNodeControls, FakeNodes
from ._fake_replica import FakeReplica, FakeState, Shared


@final
class FakeRuntime(FakeNodeControls):
    """A runtime for tests: every replica is a Python object that the test moves along.

    - ``FakeRuntime()``: each start waits until the test calls ``finish_start(tag)`` or
      ``fail_start(tag, ...)`` (or forever: a hung start, which the controller times out).
    - ``FakeRuntime(auto_ready=True)``: every start succeeds at once.
    - ``auto_drain=False``: drains wait for ``finish_drain(tag)``; never calling it is a replica
      that ignores its drain and is killed at the graceful-shutdown deadline.
    - ``auto_reconfigure=False``: reconfigures wait for ``finish_reconfigure(tag)`` or
      ``fail_reconfigure(tag, ...)``, so that UPDATING can be seen on purpose.
    - ``hung_drains``: entrypoints whose replicas never finish a drain on their own.
    - ``failing_starts``: versions whose starts fail at once (a release that cannot start),
      whatever ``auto_ready`` says.
    - ``crash(tag)``: a running replica dies on its own, and the controller is told.
    - ``capacity``: one mapping (one node) or a list of them (several nodes) for feasibility.
    - ``nodes``: named nodes (each with its labels, in order; ``capacity`` then gives one
      mapping for all or one each): the runtime places each start by the backend's rules
      (spread, pack, ``max_replicas_per_node``, ``node_labels``), avoids cordoned nodes, and
      the test can ``lose_node``, ``notice_drain`` and ``add_node``.
    - ``max_replicas``: how many replicas each node holds at all (its ``replica_slots``),
      100,000 by default, so that even a runtime with no other limit refuses an absurd count.
    - ``serve_http``: replicas of code a worker would serve answer real HTTP (``_fake_http``),
      served in the ``serve`` of the view that started them. Use the real clock.

    The same instance outlives a controller, like real processes do: hand it to a new controller
    over the same store to test recovery. Times are ``trio.current_time()``, so under
    ``autojump_clock`` they are exact.

    Fencing (``fence(epoch)``): each replica remembers the highest epoch that has commanded it
    (``FakeReplica.epoch``) and refuses drain, reconfigure, health check, kill and adoption from
    a lower one with ``FencedError``, changing nothing; each refusal is appended to ``fenced``.
    A start from an epoch lower than the highest any view was fenced at is refused too. For two
    controllers at once over the same replicas (a stale leader and a new one), give the second
    ``rt.view()``: a FakeRuntime of its own epoch and its own ``serve``, over the same replicas,
    flags, counters and history.
    """

    def __init__(
        self,
        *,
        auto_ready: bool = False,
        auto_drain: bool = True,
        auto_reconfigure: bool = True,
        hung_drains: Collection[str] = (),
        failing_starts: Collection[str] = (),
        capacity: Mapping[str, float] | Sequence[Mapping[str, float]] | None = None,
        max_replicas: int = 100_000,
        record_history: bool = True,
        nodes: Mapping[str, Mapping[str, str]] | None = None,
        serve_http: bool = False,
        pythonpath: Sequence[str | os.PathLike[str]] = (),
    ):
        named = nodes
        if capacity is None:
            each: list[dict[str, float]] = [{}]
        elif isinstance(capacity, Sequence):
            each = [dict(node) for node in capacity]
        else:
            each = [dict(capacity)]
        self._shared = Shared(
            auto_ready=auto_ready,
            auto_drain=auto_drain,
            auto_reconfigure=auto_reconfigure,
            hung_drains=frozenset(hung_drains),
            failing_starts=frozenset(failing_starts),
            nodes=[{**node, SLOTS: float(max_replicas)} for node in each],
            record_history=record_history,
            serve_http=serve_http,
            pythonpath=tuple(str(p) for p in pythonpath),
        )
        self._nursery: trio.Nursery | None = None
        if named is not None:
            self._shared.cluster = FakeNodes(named, self._shared.nodes)
        self.epoch = 0
        """The epoch this view commands replicas with (0 until ``fence``)."""

    def view(self) -> FakeRuntime:
        """Another FakeRuntime over the same replicas (and flags, ``start_calls``,
        ``history``, ``fenced``): a second controller's, with its own ``fence`` epoch (0 at
        first) and its own ``serve``. The test's calls (``finish_start``, ``crash``...) work
        through any view. A replica's death (``crash``) and load are told to every view that
        serves at the time, as every controller watching a process would hear of its end."""
        other = FakeRuntime.__new__(FakeRuntime)
        other._shared = self._shared
        other.epoch = 0
        other._nursery = None
        return other

    # -- the settings and records every view shares --

    @property
    def auto_ready(self) -> bool:
        """Starts succeed at once."""
        return self._shared.auto_ready

    @auto_ready.setter
    def auto_ready(self, value: bool) -> None:
        self._shared.auto_ready = value

    @property
    def auto_drain(self) -> bool:
        """Drains return at once (but ``hung_drains``)."""
        return self._shared.auto_drain

    @auto_drain.setter
    def auto_drain(self, value: bool) -> None:
        self._shared.auto_drain = value

    @property
    def auto_reconfigure(self) -> bool:
        """Reconfigures succeed at once."""
        return self._shared.auto_reconfigure

    @auto_reconfigure.setter
    def auto_reconfigure(self, value: bool) -> None:
        self._shared.auto_reconfigure = value

    @property
    def hung_drains(self) -> frozenset[str]:
        """Entrypoints whose replicas never finish a drain on their own."""
        return self._shared.hung_drains

    @hung_drains.setter
    def hung_drains(self, value: Collection[str]) -> None:
        self._shared.hung_drains = frozenset(value)

    @property
    def failing_starts(self) -> frozenset[str]:
        """Versions whose starts fail at once."""
        return self._shared.failing_starts

    @failing_starts.setter
    def failing_starts(self, value: Collection[str]) -> None:
        self._shared.failing_starts = frozenset(value)

    @property
    def replicas(self) -> dict[str, FakeReplica]:
        """Every replica ever started, dead ones included, by tag."""
        return self._shared.replicas

    @property
    def start_calls(self) -> int:
        """How many starts the controllers asked for (refused ones too)."""
        return self._shared.start_calls

    @start_calls.setter
    def start_calls(self, value: int) -> None:
        self._shared.start_calls = value

    @property
    def history(self) -> list[tuple[float, str, str]]:
        """``(time, tag, what)`` for each call and transition, in order."""
        return self._shared.history

    @property
    def fenced(self) -> list[tuple[str, str, int]]:
        """``(op, tag, epoch)`` of each command refused for its epoch, in order: op is
        ``"start"``, ``"adopt"``, ``"reconfigure"``, ``"check_health"``, ``"drain"`` or
        ``"kill"`` (the names of ``RuntimeWrapper``), epoch the refused caller's."""
        return self._shared.fenced

    # -- what a test reads --

    def tags(self, state: FakeState | None = None, *, backend: str | None = None) -> list[str]:
        """Tags of the replicas in `state` (every non-dead one by default), of `backend` only
        if given."""
        return [
            t
            for t, r in self.replicas.items()
            if (r.state is state if state is not None else r.state is not FakeState.DEAD)
            and (backend is None or r.backend == backend)
        ]

    async def wait_until(self, predicate: Callable[[FakeRuntime], bool]) -> None:
        """Wait until `predicate(self)` holds; it is checked after every change of this runtime
        (through any of its views)."""
        while not predicate(self):
            await self._shared.changed.wait()

    # -- what a test does --

    def finish_start(self, tag: str) -> None:
        """Make a pending start succeed."""
        replica = self._get(tag, FakeState.STARTING)
        self._ready(replica)

    def fail_start(
        self,
        tag: str,
        error_type: str = "RuntimeError",
        message: str = "start failed",
        traceback: str | None = None,
    ) -> None:
        """Make a pending start raise, as if the user's ``__init__`` raised `error_type` (with
        `traceback`, the user's traceback as text, if given)."""
        replica = self._get(tag, FakeState.STARTING)
        replica._die(ReplicaError(tag, error_type, message, traceback))
        self._note(tag, f"start failed: {error_type}: {message}")

    def finish_reconfigure(self, tag: str) -> None:
        """Make a reconfigure held open (``auto_reconfigure=False``) succeed."""
        self.replicas[tag]._end_reconfigure(None)

    def fail_reconfigure(
        self, tag: str, error_type: str = "ValueError", message: str = "bad config"
    ) -> None:
        """Make a reconfigure held open raise, as if the user's ``reconfigure`` raised."""
        self.replicas[tag]._end_reconfigure((error_type, message))

    def finish_drain(self, tag: str) -> None:
        """Make a pending drain return."""
        replica = self._get(tag, FakeState.DRAINING)
        replica._drain_done.set()
        self._note(tag, "drained")

    def crash(self, tag: str, reason: str = "crashed") -> None:
        """Kill a replica from outside the controller (it dies on its own); tell the controller."""
        self._kill(tag, reason)
        for listener in list(self._shared.listeners):
            listener(tag, reason)

    def _lost_with_node(self, tag: str, node: str, reason: str) -> None:
        """A replica goes with its node; the controller is told so (not of a crash)."""
        self._kill(tag, reason)
        for listener in list(self._shared.listeners):
            tell_lost_with_node(listener, tag, node, reason)

    def _kill(self, tag: str, reason: str) -> None:
        replica = self.replicas[tag]
        if replica.state is FakeState.DEAD:
            raise ValueError(f"replica {tag} is already dead")
        replica._die(ReplicaError(tag, "ReplicaDied", reason))
        self._note(tag, f"crashed: {reason}")

    def report_load(
        self,
        tag: str,
        ongoing: int | None,
        served: int | None = None,
        code: CodeReport | None = None,
    ) -> None:
        """Have a live replica report its own load, as a replica's ``load()`` does through a
        real runtime (and, for code a runtime serves, the requests it has answered, and a
        replica's models and batches)."""
        if self.replicas[tag].state is FakeState.DEAD:
            raise ValueError(f"replica {tag} is dead")
        for listener in list(self._shared.listeners):
            tell_load(listener, tag, ongoing, served, code)

    # -- the Runtime protocol --

    async def serve(
        self,
        on_death: DeathListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self._shared.listeners.append(on_death)
        try:
            async with trio.open_nursery() as nursery:  # the HTTP servers of its replicas
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._shared.listeners.remove(on_death)

    async def capacity(self) -> Sequence[Mapping[str, float]] | None:
        cluster = self._shared.cluster
        return self._shared.nodes if cluster is None else cluster.capacity()

    def fence(self, epoch: int) -> None:
        """Command replicas as the leader of `epoch` from now on (this view only); starts from
        a lower epoch are refused from now on, through any view."""
        self.epoch = epoch
        self._shared.fenced_at = max(self._shared.fenced_at, epoch)

    async def list_replicas(self) -> Sequence[str]:
        await trio.lowlevel.checkpoint()
        return self.tags()

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaInfo | str | None:
        if spec.tag in self.replicas and self.replicas[spec.tag].state is not FakeState.DEAD:
            raise AssertionError(f"controller bug: started {spec.tag} twice")
        self.start_calls += 1
        if self.epoch < self._shared.fenced_at:
            await trio.lowlevel.checkpoint()
            self._refuse("start", spec.tag, self._shared.fenced_at)
        node = None
        if self._shared.cluster is not None:
            try:
                node = self._cluster().place(spec, self.replicas.values())
            except ReplicaError:
                await trio.lowlevel.checkpoint()
                raise
        replica = FakeReplica(
            spec.tag,
            spec,
            user_config=spec.user_config,
            started_at=trio.current_time(),
            epoch=self.epoch,
            node=node,
        )
        self.replicas[spec.tag] = replica
        self._note(spec.tag, "start")
        if spec.version in self.failing_starts:
            await trio.lowlevel.checkpoint()
            self.fail_start(spec.tag, "ValueError", f"version {spec.version} cannot start")
        elif self.auto_ready:
            self._ready(replica)
            await trio.lowlevel.checkpoint()
        else:
            await replica._start_done.wait()
        address = replica._start_outcome()
        if self._shared.serve_http:
            await serve_code(replica, self._shared.pythonpath, self._nursery, self.report_load)
            address = replica.address
        return self._info(replica, address)

    async def adopt_replica(self, tag: str) -> ReplicaInfo | str | None:
        replica = self.replicas.get(tag)
        if replica is None or replica.state is FakeState.DEAD:
            raise ReplicaGoneError(tag)
        self._admit("adopt", replica)
        self._note(tag, "adopt")
        return self._info(replica, await replica._answer_adoption())

    async def reconfigure_replica(self, tag: str, user_config: JSON) -> None:
        self._admit("reconfigure", self.replicas.get(tag))
        replica = self._get(tag, FakeState.READY)
        held = not self.auto_reconfigure
        if held:
            self._note(tag, "reconfigure")
        error = await replica._answer_reconfigure(user_config, held=held)
        if error is None and replica.server is not None:
            error = await reconfigure_code(replica.server, user_config)
        if error is not None:
            self._note(tag, "reconfigure failed")
            raise ReplicaError(tag, *error)
        replica.user_config = user_config
        self._note(tag, "reconfigured")

    async def check_health_replica(self, tag: str) -> None:
        self._admit("check_health", self.replicas.get(tag))
        await self._get(tag, FakeState.READY)._answer_health_check()

    async def check_health_replicas(self, tags: Sequence[str], report: CheckReport) -> None:
        """Every check as ``check_health_replica`` does it, all after one checkpoint together;
        those of replicas whose checks hang are never reported (the wave's deadline ends it)."""
        results: list[tuple[str, Exception | None]] = []
        answering: list[FakeReplica] = []
        hangs = False
        for tag in tags:
            try:
                self._admit("check_health", self.replicas.get(tag))
                replica = self._get(tag, FakeState.READY)
            except Exception as exc:
                results.append((tag, exc))
                continue
            replica.health_checks.append(trio.current_time())
            if replica.health_hangs:
                hangs = True
            else:
                answering.append(replica)
        await trio.lowlevel.checkpoint()
        for replica in answering:
            error = replica.health_error
            failed = None if error is None else ReplicaError(replica.tag, *error)
            results.append((replica.tag, failed))
        report(results)
        if hangs:
            await trio.sleep_forever()

    async def drain_replica(self, tag: str) -> None:
        replica = self.replicas.get(tag)
        self._admit("drain", replica)
        if replica is None or replica.state is not FakeState.DRAINING:
            # Draining again (a restarted controller finishing a stop) waits for the same drain.
            replica = self._get(tag, FakeState.READY)
            replica.state = FakeState.DRAINING
            replica.drain_requested_at = trio.current_time()
        self._note(tag, "drain")
        if replica.server is not None:
            await replica.server.drain()  # the requests under way end, then it stops listening
        if self.auto_drain and replica.spec.replica_config.entrypoint not in self.hung_drains:
            replica._drain_done.set()
        await replica._drain_done.wait()

    async def kill_replica(self, tag: str) -> None:
        await trio.lowlevel.checkpoint()
        replica = self.replicas.get(tag)
        if replica is None:
            return
        if replica.state is FakeState.DEAD:
            # Gone already: nothing to do, but a stale leader is told so all the same (the
            # newer one killed it), so that no command of a stale epoch ever passes.
            if self.epoch < replica.epoch:
                self._refuse("kill", tag, replica.epoch)
            return
        self._admit("kill", replica)
        replica._die(ReplicaError(tag, "Killed", "killed while starting"))
        replica.killed_at = replica.stopped_at
        self._note(tag, "killed")

    # -- internals --

    def _info(self, replica: FakeReplica, address: str | None) -> ReplicaInfo | str | None:
        return address if replica.node is None else ReplicaInfo(address, None, replica.node)

    def _admit(self, op: str, replica: FakeReplica | None) -> None:
        """Refuse `op` on a live `replica` that a higher epoch than ours has commanded; else
        raise its epoch to ours."""
        if replica is None or replica.state is FakeState.DEAD:
            return
        if self.epoch < replica.epoch:
            self._refuse(op, replica.tag, replica.epoch)
        replica.epoch = self.epoch

    def _refuse(self, op: str, tag: str, newer: int) -> NoReturn:
        self.fenced.append((op, tag, self.epoch))
        self._note(tag, f"{op} fenced: epoch {self.epoch} < {newer}")
        raise FencedError(f"{op} of replica {tag}", self.epoch, newer)

    def _get(self, tag: str, state: FakeState) -> FakeReplica:
        replica = self.replicas.get(tag)
        if replica is None:
            raise ReplicaGoneError(tag)
        if replica.state is not state:
            raise ReplicaError(tag, "WrongState", f"is {replica.state.value}, not {state.value}")
        return replica

    def _ready(self, replica: FakeReplica) -> None:
        replica._become_ready()
        self._note(replica.tag, "ready")

    def _note(self, tag: str, what: str) -> None:
        shared = self._shared
        if shared.record_history:
            shared.history.append((trio.current_time(), tag, what))
        shared.changed.set()
        shared.changed = trio.Event()
