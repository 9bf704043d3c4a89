"""The replicas of FakeRuntime: where each one is, what happened to it, and how it answers the
runtime's commands as the test scripted it (its errors, hangs and held reconfigures); and the
pool of them that every view of one FakeRuntime shares, with the test's settings and records."""

from __future__ import annotations

import enum
from typing import Any, final

import attrs
import trio

from .._model.decisions.spec import ReplicaSpec
from .._model.values.errors import ReplicaError
from .._model.values.json_values import JSON
from .._ports.runtime import DeathListener
from .._serving.server import ReplicaServer


class FakeState(enum.Enum):
    """Where a fake replica is, as the runtime (not the controller) sees it."""

    #: ``start_replica`` was called and waits for ``finish_start`` or ``fail_start``.
    STARTING = "STARTING"
    #: Started; ready for requests.
    READY = "READY"
    #: Asked to drain; waits for ``finish_drain`` (unless the runtime drains instantly).
    DRAINING = "DRAINING"
    #: Killed, crashed, or failed to start. Dead replicas stay listed in ``replicas``.
    DEAD = "DEAD"


@final
@attrs.define(eq=False)
class FakeReplica:
    """One fake replica and what happened to it, with the (trio) time of each step."""

    tag: str
    """The controller's tag for it."""
    spec: ReplicaSpec
    """What the controller asked for."""
    state: FakeState = FakeState.STARTING
    """Where it is."""
    user_config: JSON = None
    """The user config it holds (from its start, then from each reconfigure)."""
    started_at: float = 0.0
    """When ``start_replica`` was called."""
    ready_at: float | None = None
    """When it became ready."""
    drain_requested_at: float | None = None
    """When the controller asked it to drain."""
    killed_at: float | None = None
    """When it was killed by the controller (not set for a crash or a failed start)."""
    stopped_at: float | None = None
    """When it stopped, whatever the way: killed, crashed, or its start failed."""
    reconfigure_calls: int = 0
    """How many reconfigures it received."""
    reconfigure_error: tuple[str, str] | None = None
    """Make its next reconfigures raise ``(error_type, message)``; None: they succeed."""
    reconfiguring: JSON = None
    """The config of the reconfigure the test holds open (``auto_reconfigure=False``)."""
    node: str | None = None
    """The node it was placed on (a FakeRuntime given ``nodes``)."""
    health_error: tuple[str, str] | None = None
    """Make its health checks raise ``(error_type, message)``; None: they pass."""
    health_hangs: bool = False
    """Make its health checks never answer (the controller times them out)."""
    health_checks: list[float] = attrs.field(factory=list)
    """When each health check arrived."""
    adoption_hangs: bool = False
    """Make a controller's adoption of it never answer (a process hung while no controller
    ran)."""
    epoch: int = 0
    """The highest epoch that has commanded it: its start's, then raised by an adoption or a
    command from a higher one. Drains, reconfigures, health checks, kills and adoptions from a
    lower epoch are refused (``FencedError``)."""
    server: ReplicaServer | None = None
    """Its HTTP server, when it is code the runtime serves (``FakeRuntime(serve_http=True)``)."""
    _server_scope: trio.CancelScope | None = None
    _start_done: trio.Event = attrs.field(factory=trio.Event)
    _start_error: ReplicaError | None = None
    _drain_done: trio.Event = attrs.field(factory=trio.Event)
    _reconfigure_done: trio.Event | None = None
    _reconfigure_outcome: tuple[str, str] | None = None

    @property
    def backend(self) -> str:
        """The backend it belongs to."""
        return self.spec.backend

    @property
    def address(self) -> str:
        """Where routers reach it: its HTTP server's address, or a name that reaches nothing."""
        if self.server is not None:
            return f"127.0.0.1:{self.server.port}"
        return f"fake://{self.tag}"

    # -- how it answers its runtime, as scripted --

    def _become_ready(self) -> None:
        self.state = FakeState.READY
        self.ready_at = trio.current_time()
        self._start_done.set()

    def _die(self, start_error: ReplicaError) -> None:
        """It is dead (killed, crashed, or its start failed); a start still under way raises
        `start_error`."""
        if self.state is FakeState.STARTING:
            self._start_error = start_error
            self._start_done.set()
        self.state = FakeState.DEAD
        self.stopped_at = trio.current_time()
        if self._server_scope is not None:
            self._server_scope.cancel()  # its process is gone: so is what it served

    def _start_outcome(self) -> str | None:
        """Its address, once its start has ended; raises if the start failed."""
        if self._start_error is not None:
            raise self._start_error
        return self.address

    async def _answer_adoption(self) -> str | None:
        if self.adoption_hangs:
            await trio.sleep_forever()
        await self._start_done.wait()
        return self._start_outcome()

    async def _answer_reconfigure(self, user_config: JSON, *, held: bool) -> tuple[str, str] | None:
        """The error of a reconfigure to `user_config`, or None: the scripted
        ``reconfigure_error`` at once, or, if `held`, what the test ends it with."""
        self.reconfigure_calls += 1
        error = self.reconfigure_error
        if not held:
            await trio.lowlevel.checkpoint()
            return error
        self.reconfiguring = user_config
        self._reconfigure_done = trio.Event()
        try:
            await self._reconfigure_done.wait()
        finally:
            self._reconfigure_done = None
        return self._reconfigure_outcome

    def _end_reconfigure(self, outcome: tuple[str, str] | None) -> None:
        if self._reconfigure_done is None:
            raise ValueError(f"replica {self.tag} has no reconfigure in flight")
        self._reconfigure_outcome = outcome
        self._reconfigure_done.set()

    async def _answer_health_check(self) -> None:
        self.health_checks.append(trio.current_time())
        if self.health_hangs:
            await trio.sleep_forever()
        await trio.lowlevel.checkpoint()
        if self.health_error is not None:
            raise ReplicaError(self.tag, *self.health_error)


@final
@attrs.define(eq=False)
class Shared:
    """What the views of one FakeRuntime share: the replicas, the test's settings, the
    records."""

    auto_ready: bool
    auto_drain: bool
    auto_reconfigure: bool
    hung_drains: frozenset[str]
    failing_starts: frozenset[str]
    nodes: list[dict[str, float]]
    record_history: bool
    replicas: dict[str, FakeReplica] = attrs.field(factory=dict)
    start_calls: int = 0
    history: list[tuple[float, str, str]] = attrs.field(factory=list)
    fenced: list[tuple[str, str, int]] = attrs.field(factory=list)
    fenced_at: int = 0
    """The highest epoch any view was fenced at: starts from a lower one are refused."""
    listeners: list[DeathListener] = attrs.field(factory=list)
    """The death listeners of the views that serve now."""
    changed: trio.Event = attrs.field(factory=trio.Event)
    cluster: Any = None
    """The nodes (``_fake_nodes.FakeNodes``), for a FakeRuntime given ``nodes``."""
    serve_http: bool = False
    """Code backends (a function, a callable class, an ASGI app) answer real HTTP."""
    pythonpath: tuple[str, ...] = ()
    """Where their entrypoints are imported from, before ``sys.path``."""
