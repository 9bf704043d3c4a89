"""Wrappers that pass every call of a Runtime or a Store through one method, ``around``: the
daemon's metrics time calls with them, ``controller.testing.FaultInjector`` crashes at one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import trio

from .._model.config.nodes import NodeInfo
from .._model.decisions.spec import ReplicaSpec
from .._model.values.errors import NodesUnsupportedError
from .._model.values.json_values import JSON
from .runtime import (
    CheckReport,
    DeathListener,
    ReplicaInfo,
    Runtime,
    batched_checks,
    check_each,
    node_runtime,
)
from .store import Store

T = TypeVar("T")


class RuntimeWrapper:
    """A Runtime that hands each replica call to `inner` through ``around(op, tag, work)``.
    ``serve`` and ``capacity`` pass straight through: they are not steps of the controller's."""

    def __init__(self, inner: Runtime):
        self.inner = inner

    async def around(self, op: str, tag: str | None, work: Callable[[], Awaitable[T]]) -> T:
        """Do `work` (the inner call `op`, about replica `tag`); override to add to it."""
        return await work()

    async def serve(
        self,
        on_death: DeathListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await self.inner.serve(on_death, task_status=task_status)

    async def capacity(self) -> Sequence[Mapping[str, float]] | None:
        return await self.inner.capacity()

    def fence(self, epoch: int) -> None:
        self.inner.fence(epoch)

    # -- nodes, passed straight through when the inner runtime has them (NodeRuntime) --

    @property
    def supports_nodes(self) -> bool:
        return node_runtime(self.inner) is not None

    async def nodes(self) -> Sequence[NodeInfo]:
        inner = node_runtime(self.inner)
        if inner is None:
            raise NodesUnsupportedError(f"{type(self.inner).__name__} has no nodes")
        return await inner.nodes()

    def cordon(self, nodes: frozenset[str]) -> None:
        inner = node_runtime(self.inner)
        if inner is not None:
            inner.cordon(nodes)

    async def list_replicas(self) -> Sequence[str]:
        return await self.around("list_replicas", None, self.inner.list_replicas)

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaInfo | str | None:
        return await self.around("start", spec.tag, lambda: self.inner.start_replica(spec))

    async def adopt_replica(self, tag: str) -> ReplicaInfo | str | None:
        return await self.around("adopt", tag, lambda: self.inner.adopt_replica(tag))

    async def reconfigure_replica(self, tag: str, user_config: JSON) -> None:
        await self.around(
            "reconfigure", tag, lambda: self.inner.reconfigure_replica(tag, user_config)
        )

    async def check_health_replica(self, tag: str) -> None:
        await self.around("check_health", tag, lambda: self.inner.check_health_replica(tag))

    async def check_health_replicas(self, tags: Sequence[str], report: CheckReport) -> None:
        """Each check through ``around``, a task each. A wrapper that can do without ``around``
        for checks overrides this to pass the inner runtime's batch on (``inner_checks``)."""
        await check_each(self, tags, report)

    async def inner_checks(self, tags: Sequence[str], report: CheckReport) -> None:
        """The inner runtime's batch of checks, if it has one; else ``check_health_replicas``
        as this class does it."""
        batched = batched_checks(self.inner)
        if batched is None:
            await check_each(self, tags, report)
        else:
            await batched.check_health_replicas(tags, report)

    async def drain_replica(self, tag: str) -> None:
        await self.around("drain", tag, lambda: self.inner.drain_replica(tag))

    async def kill_replica(self, tag: str) -> None:
        await self.around("kill", tag, lambda: self.inner.kill_replica(tag))


class StoreWrapper:
    """A Store that hands each call to `inner` through ``around(op, keys, work)``."""

    def __init__(self, inner: Store):
        self.inner = inner

    async def around(self, op: str, keys: Sequence[str], work: Callable[[], Awaitable[T]]) -> T:
        return await work()

    async def read_all(self) -> dict[str, str]:
        return await self.around("read_all", (), self.inner.read_all)

    async def write(self, changes: Mapping[str, str | None]) -> None:
        await self.around("write", sorted(changes), lambda: self.inner.write(changes))
