"""The Runtime protocol: where replicas live. The core speaks only this; runtimes never see it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, cast, final, runtime_checkable

import attrs
import trio

from .._model.config.nodes import NodeInfo
from .._model.decisions.spec import ReplicaSpec
from .._model.records.code_report import CodeReport
from .._model.values.json_values import JSON

#: Called by a runtime, from trio, when a replica it started or adopted dies on its own:
#: ``on_death(tag, reason)``. It must not block; the controller turns it into an event.
DeathListener = Callable[[str, str], None]

#: How ``check_health_replicas`` reports checks as they end: a list of (tag, None if it passed,
#: else what ``check_health_replica`` would have raised), each tag once. It must not block.
CheckReport = Callable[[list[tuple[str, Exception | None]]], None]


@runtime_checkable
class ReplicaListener(Protocol):
    """What the controller hands ``serve``: a DeathListener that also takes the load a replica
    reports of itself. A runtime that can carry a replica's ``load()`` calls ``load``; any
    other treats it as a plain DeathListener."""

    def __call__(self, tag: str, reason: str) -> None:
        """`tag` died on its own, for `reason`."""
        ...

    def load(
        self,
        tag: str,
        ongoing: int | None,
        served: int | None = None,
        code: CodeReport | None = None,
    ) -> None:
        """`tag`'s own ``load()`` now says `ongoing` (requests it holds; None: it no longer
        says, and what it said stops counting); `served`: the requests it has answered, for
        code the runtime serves (None: not known); `code`: its code's models and batches
        (``CodeReport``). Must not block."""
        ...


@attrs.frozen
class ReplicaInfo:
    """What a runtime tells of a replica once it is ready (``start_replica``, ``adopt_replica``).

    A runtime may return a plain address (``str``) or None instead, and say nothing more.
    """

    address: str | None = None
    """Where it serves, as routers should reach it (None if the runtime has no such notion)."""
    pid: int | None = None
    """Its process id, where it has one of its own."""
    node: str | None = None
    """The machine (or cluster node) it runs on."""


class Runtime(Protocol):
    """Where replicas live: worker processes, Ray actors, or ``controller.testing.FakeRuntime``.

    Every method may be cancelled; a cancelled start may leave a half-started replica behind, which
    the controller then kills by tag. No method has a timeout of its own: the controller wraps calls
    in cancel scopes. Failures of the user's code are raised as ``ReplicaError``, with the user's
    traceback where the runtime has it.
    """

    async def serve(
        self,
        on_death: DeathListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the runtime's background work (watching replicas) until cancelled.

        Started by the controller with ``nursery.start``; report deaths through `on_death`.
        Cancelling it must leave the replicas running: a controller restart adopts them.
        """
        ...

    async def capacity(self) -> Sequence[Mapping[str, float]] | None:
        """What each node can give this controller's replicas in all (one mapping per node), or
        None for no limit: a node's total, less what others than this runtime's replicas hold
        there. Asked before every scale-up, so a runtime shared with others answers afresh.

        Each node should say how many replicas it can hold at all, under the key
        ``"replica_slots"`` (each replica takes one, whatever else it asks for): without it, a
        replica that asks for nothing costs nothing, and no count would ever be refused."""
        ...

    async def list_replicas(self) -> Sequence[str]:
        """The tags of every replica this runtime has, alive or starting."""
        ...

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaInfo | str | None:
        """Start a replica and return once it is ready, with what is known of it (or just its
        address, or None)."""
        ...

    async def adopt_replica(self, tag: str) -> ReplicaInfo | str | None:
        """Reattach to a live replica found by ``list_replicas``; return once it is ready, as
        ``start_replica`` does. Raises ``ReplicaGoneError`` if it is not there."""
        ...

    async def reconfigure_replica(self, tag: str, user_config: JSON) -> None:
        """Hand a running replica a new user config."""
        ...

    async def check_health_replica(self, tag: str) -> None:
        """Call the replica's health check; raise ``ReplicaError`` if it reports a problem.

        A runtime may also have ``check_health_replicas`` (``BatchedChecks``): the controller
        then checks the replicas due together with one call of it instead of a task a check."""
        ...

    async def drain_replica(self, tag: str) -> None:
        """Ask a replica to finish its in-flight work; return when it has. Idempotent: a
        replica already draining (a restarted controller finishing a stop) is waited for."""
        ...

    async def kill_replica(self, tag: str) -> None:
        """Stop a replica for sure and return when it is gone. Idempotent: a missing tag is fine."""
        ...

    def fence(self, epoch: int) -> None:
        """Command replicas as the leader of `epoch` from now on (called once a daemon wins the
        lease, before it recovers; epochs only grow).

        Each replica remembers the highest epoch that has commanded it (its start, its adoption,
        any command) and refuses drain, reconfigure and kill from a lower one by raising
        ``FencedError``: nothing of such a command takes effect. Adoption raises a replica's
        epoch to this one. A runtime never fenced commands with epoch 0, which any fenced
        command outranks."""
        ...


@runtime_checkable
class NodeRuntime(Protocol):
    """What a runtime of several nodes adds to the Runtime protocol (RayRuntime; FakeRuntime
    given ``nodes``): its nodes, and which of them take no new replica. It places each start
    itself, by the spec's rules (``_model.config.nodes.choose_node``), and says where in the
    ``ReplicaInfo`` it returns. When its view of the nodes changes (one died, or the cluster
    announced a drain), it calls the listener's ``nodes_changed()`` if it has one."""

    async def nodes(self) -> Sequence[NodeInfo]:
        """Every node it knows, alive or not."""
        ...

    def cordon(self, nodes: frozenset[str]) -> None:
        """Start no replica on `nodes` from now on (the set replaces the last one)."""
        ...


@runtime_checkable
class BatchedChecks(Protocol):
    """What a runtime may add to the Runtime protocol: the health checks of many replicas due
    together in one call, which costs the controller one task (not one a check) and lets the
    runtime ask them all before it waits for any."""

    async def check_health_replicas(self, tags: Sequence[str], report: CheckReport) -> None:
        """Check each of `tags` as ``check_health_replica`` does; `report` each as it ends (or
        several together), and return once all are reported. Cancelled at the checks' deadline:
        those not reported by then count as timed out."""
        ...


@runtime_checkable
class NodesListener(Protocol):
    """A listener a runtime of several nodes tells when its view of them changes."""

    def nodes_changed(self) -> None:
        """The nodes changed: one died, joined, or was announced to drain. Must not block."""
        ...


@runtime_checkable
class NodeLossListener(Protocol):
    """A listener a runtime of several nodes tells of the replicas a lost node took with it:
    they did not crash, and their replacements should not wait out a crash loop's backoff."""

    def lost_with_node(self, tag: str, node: str, reason: str) -> None:
        """`tag` is gone because its node `node` was lost (`reason` in words). Must not
        block."""
        ...


@attrs.frozen
class LogChunk:
    """Text read from a replica's log, and where the next read of new text starts."""

    text: str
    offset: int
    """The size of the current log file when read: pass it back to get only what follows."""


@runtime_checkable
class LogSource(Protocol):
    """What a runtime may add to the Runtime protocol: its replicas' logs (LocalRuntime reads
    its workers' files, RayRuntime asks each replica's actor). Blocking: the API calls them in
    a thread."""

    def log_tags(self, backend: str | None = None) -> list[str]:
        """The tags that have a log (of `backend`'s replicas only, if given)."""
        ...

    def read_log(self, tag: str, *, offset: int | None = None, tail: int = 100) -> LogChunk | None:
        """The last `tail` lines of `tag`'s log, or what follows `offset`; None if none."""
        ...


class _SaysNodes(Protocol):
    """A wrapper (metrics, fencing) has a NodeRuntime's methods whatever it wraps: it says here
    whether they lead anywhere."""

    @property
    def supports_nodes(self) -> bool: ...


# The optional parts of a runtime are found here, by their protocols, and nowhere else: as
# methods of its class, asked once a class. (An isinstance check of a protocol costs about 20 us
# here, and a replica's every load report and a backend's every wave of checks asks.)


_KINDS: dict[tuple[type, type], bool] = {}


def _kind_is(kind: type, protocol: type) -> bool:
    key = (kind, protocol)
    found = _KINDS.get(key)
    if found is None:
        found = _KINDS[key] = issubclass(kind, protocol)
    return found


def node_runtime(runtime: object) -> NodeRuntime | None:
    """`runtime` as a runtime of several nodes, or None if it is not one."""
    kind = type(runtime)
    if not _kind_is(kind, NodeRuntime):
        return None
    if hasattr(kind, "supports_nodes") and not cast(_SaysNodes, runtime).supports_nodes:
        return None
    return cast(NodeRuntime, runtime)


def batched_checks(runtime: object) -> BatchedChecks | None:
    """`runtime`'s batch of health checks, or None if it checks one replica a call."""
    return cast(BatchedChecks, runtime) if _kind_is(type(runtime), BatchedChecks) else None


def log_source(runtime: object) -> LogSource | None:
    """Where `runtime`'s replica logs are read, or None if it keeps none."""
    return cast(LogSource, runtime) if _kind_is(type(runtime), LogSource) else None


async def check_each(runtime: Runtime, tags: Sequence[str], report: CheckReport) -> None:
    """``check_health_replicas`` for a runtime without it: a task a check, in one task group,
    each reported as it ends."""

    async def one(tag: str) -> None:
        try:
            await runtime.check_health_replica(tag)
        except Exception as exc:
            report([(tag, exc)])
        else:
            report([(tag, None)])

    if len(tags) == 1:
        await one(tags[0])
        return
    async with trio.open_nursery() as nursery:
        for tag in tags:
            nursery.start_soon(one, tag)


@final
class Watchers:
    """A runtime's background work (one watcher per replica, that tells of its death) in a
    nursery that lives from ``serve`` until it is cancelled; for runtimes to share."""

    def __init__(self, runtime_name: str):
        self._name = runtime_name
        self._nursery: trio.Nursery | None = None
        self._on_death: DeathListener | None = None

    async def serve(
        self,
        on_death: DeathListener,
        task_status: trio.TaskStatus[None],
        cleanup: Callable[[], None],
    ) -> None:
        """Run until cancelled; `cleanup` then (the replicas live on: a later controller adopts
        them)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery, self._on_death = nursery, on_death
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery, self._on_death = None, None
            cleanup()

    def check_running(self) -> None:
        assert self._nursery is not None, f"{self._name}.serve is not running"

    def start_soon(self, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        self.check_running()
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    def load(
        self,
        tag: str,
        ongoing: int | None,
        served: int | None = None,
        code: CodeReport | None = None,
    ) -> None:
        """Tell the controller, if one is listening and takes it, what `tag` reports of its load
        (and of the requests it has answered, and of its models and batches)."""
        tell_load(self._on_death, tag, ongoing, served, code)

    def nodes_changed(self) -> None:
        """Tell the controller, if one is listening and takes it, that the nodes changed."""
        tell_nodes_changed(self._on_death)

    def died(self, tag: str, reason: str) -> None:
        """Tell the controller, if one is listening, that `tag` died on its own."""
        if self._on_death is not None:
            self._on_death(tag, reason)

    def lost_with_node(self, tag: str, node: str, reason: str) -> None:
        """Tell the controller, if one is listening, that `tag` went with its node `node`."""
        if self._on_death is not None:
            tell_lost_with_node(self._on_death, tag, node, reason)


def tell_load(
    listener: object,
    tag: str,
    ongoing: int | None,
    served: int | None = None,
    code: CodeReport | None = None,
) -> None:
    """Give `listener` a replica's own load report if it takes one (a ``ReplicaListener``; a
    plain DeathListener does not)."""
    if _kind_is(type(listener), ReplicaListener):
        take = cast(ReplicaListener, listener)
        if code is None:
            take.load(tag, ongoing, served)
        else:
            take.load(tag, ongoing, served, code)


def tell_lost_with_node(listener: DeathListener, tag: str, node: str, reason: str) -> None:
    """Tell `listener` that `tag` went with its lost node: as such if it listens for that (a
    ``NodeLossListener``), else as a death."""
    if _kind_is(type(listener), NodeLossListener):
        cast(NodeLossListener, listener).lost_with_node(tag, node, reason)
    else:
        listener(tag, reason)


def tell_nodes_changed(listener: object) -> None:
    """Tell `listener` the nodes changed, if it listens for that (a ``NodesListener``)."""
    if _kind_is(type(listener), NodesListener):
        cast(NodesListener, listener).nodes_changed()
