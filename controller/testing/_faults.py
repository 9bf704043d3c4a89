"""FaultInjector: crash a controller at its k-th step, for crash-at-every-step tests.

A step is one call the controller makes through the injector's wrappers: a store read or write,
or a runtime call (list, start, adopt, reconfigure, health check, drain, kill). At the chosen
step the controller "crashes": that call raises ``ControllerCrash`` (a BaseException, which no
``except Exception`` in the controller swallows), either before doing its work or just after it,
and so does every later call through the wrappers. The crash propagates up and ends the
controller's whole task tree, while the store and the runtime stay exactly as they were: open a
new controller over them to test recovery.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar, final

import trio

from .._json import JSON
from .._runtime import DeathListener, ReplicaSpec, Runtime
from .._store import Store

T = TypeVar("T")


class ControllerCrash(BaseException):
    """The controller under test crashed here (raised by a FaultInjector)."""


@final
class FaultInjector:
    """Counts the steps of a controller; crashes it at step `crash_at` (1-based; None: never).

    With `after`, the crashing step is done first (the write lands, the replica starts), then the
    crash; otherwise the step is not done at all. `log` names every step taken.
    """

    def __init__(self, crash_at: int | None = None, *, after: bool = False):
        self.crash_at = crash_at
        self.after = after
        self.steps = 0
        self.log: list[str] = []
        self.crashed = False

    def store(self, inner: Store) -> Store:
        return _Store(inner, self)

    def runtime(self, inner: Runtime) -> Runtime:
        return _Runtime(inner, self)

    async def step(self, what: str, work: Callable[[], Awaitable[T]]) -> T:
        if self.crashed:
            raise ControllerCrash(f"already crashed; not doing {what}")
        self.steps += 1
        this = self.steps  # other tasks take steps while this one's work is under way
        self.log.append(what)
        if this == self.crash_at and not self.after:
            self.crashed = True
            raise ControllerCrash(f"crashed before step {this}: {what}")
        result = await work()
        if this == self.crash_at and self.after:
            self.crashed = True
            raise ControllerCrash(f"crashed after step {this}: {what}")
        return result


@final
class _Store:
    def __init__(self, inner: Store, faults: FaultInjector):
        self._inner = inner
        self._faults = faults

    async def read_all(self) -> dict[str, str]:
        return await self._faults.step("store.read_all", self._inner.read_all)

    async def write(self, changes: Mapping[str, str | None]) -> None:
        await self._faults.step(
            f"store.write {sorted(changes)}", lambda: self._inner.write(changes)
        )


@final
class _Runtime:
    def __init__(self, inner: Runtime, faults: FaultInjector):
        self._inner = inner
        self._faults = faults

    async def serve(
        self,
        on_death: DeathListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await self._inner.serve(on_death, task_status=task_status)

    async def capacity(self) -> Sequence[Mapping[str, float]] | None:
        return await self._inner.capacity()

    async def list_replicas(self) -> Sequence[str]:
        return await self._faults.step("runtime.list_replicas", self._inner.list_replicas)

    async def start_replica(self, spec: ReplicaSpec) -> str | None:
        return await self._faults.step(
            f"runtime.start {spec.tag}", lambda: self._inner.start_replica(spec)
        )

    async def adopt_replica(self, tag: str) -> str | None:
        return await self._faults.step(
            f"runtime.adopt {tag}", lambda: self._inner.adopt_replica(tag)
        )

    async def reconfigure_replica(self, tag: str, user_config: JSON) -> None:
        await self._faults.step(
            f"runtime.reconfigure {tag}",
            lambda: self._inner.reconfigure_replica(tag, user_config),
        )

    async def check_health_replica(self, tag: str) -> None:
        await self._faults.step(
            f"runtime.check_health {tag}", lambda: self._inner.check_health_replica(tag)
        )

    async def drain_replica(self, tag: str) -> None:
        await self._faults.step(f"runtime.drain {tag}", lambda: self._inner.drain_replica(tag))

    async def kill_replica(self, tag: str) -> None:
        await self._faults.step(f"runtime.kill {tag}", lambda: self._inner.kill_replica(tag))
