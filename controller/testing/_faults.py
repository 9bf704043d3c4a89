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

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, final

from .._ports.runtime import Runtime
from .._ports.store import Store
from .._ports.wrap import RuntimeWrapper, StoreWrapper

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
        self.outcomes: list[tuple[int, str, str | None]] = []
        """Each step that ended: its number (in the order steps began), what it was, and the
        name of what it raised (None: it took effect), in the order they ended. A stale
        leader's refused commands show as ``FencedError``."""

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
        try:
            result = await work()
        except Exception as exc:
            self.outcomes.append((this, what, type(exc).__name__))
            raise
        self.outcomes.append((this, what, None))
        if this == self.crash_at and self.after:
            self.crashed = True
            raise ControllerCrash(f"crashed after step {this}: {what}")
        return result


@final
class _Store(StoreWrapper):
    def __init__(self, inner: Store, faults: FaultInjector):
        super().__init__(inner)
        self._faults = faults

    async def around(self, op: str, keys: Sequence[str], work: Callable[[], Awaitable[T]]) -> T:
        return await self._faults.step(f"store.{op} {list(keys)}" if keys else f"store.{op}", work)


@final
class _Runtime(RuntimeWrapper):
    def __init__(self, inner: Runtime, faults: FaultInjector):
        super().__init__(inner)
        self._faults = faults

    async def around(self, op: str, tag: str | None, work: Callable[[], Awaitable[T]]) -> T:
        return await self._faults.step(f"runtime.{op} {tag}" if tag else f"runtime.{op}", work)
