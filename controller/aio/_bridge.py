"""What both ways of embedding share: the trio side that hosts the controller, and the asyncio
facade that calls into it.

Whichever way trio runs beside asyncio (as a guest of asyncio's loop, or under trio-asyncio), the
two share one thread. A call from asyncio becomes a trio task in the host's nursery, started with
the trio token's ``run_sync_soon``; its outcome comes back on an asyncio future. Cancelling the
asyncio caller cancels that trio task; the trio task ending by cancellation (the controller
closing under it) fails the caller with ``ControllerClosedError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar, final, overload

import trio

from .._backend.goal import Goal
from .._core.controller import Controller
from .._core.open import open_controller
from .._model.config.config import BackendConfig
from .._model.config.replica_config import ReplicaConfig
from .._model.decisions.policy import RestartPolicy
from .._model.values.errors import ControllerClosedError
from .._model.views.status import BackendSnapshot, BackendStatus, ControllerStatus, GoalOutcome
from .._ports.runtime import Runtime
from .._ports.store import Store

T = TypeVar("T")


@final
class Bridge:
    """Runs trio coroutine functions for asyncio callers, in the host's nursery."""

    def __init__(self, token: trio.lowlevel.TrioToken, nursery: trio.Nursery):
        self._token = token
        self._nursery = nursery

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        scopes: list[trio.CancelScope] = []

        async def in_trio() -> None:
            with trio.CancelScope() as scope:
                scopes.append(scope)
                if future.done():  # cancelled before this task began
                    return
                try:
                    result = await fn(*args)
                except trio.Cancelled:
                    _settle(future, ControllerClosedError("the controller closed during the call"))
                    raise
                except BaseException as exc:
                    _settle(future, exc)
                    if not isinstance(exc, Exception):
                        raise  # KeyboardInterrupt and friends belong to trio too
                    return
                if not future.done():
                    future.set_result(result)

        def begin() -> None:
            try:
                self._nursery.start_soon(in_trio)
            except RuntimeError:  # the nursery is closing: the controller is
                _settle(future, ControllerClosedError("the controller is closed"))

        try:
            self._token.run_sync_soon(begin)
        except trio.RunFinishedError:
            raise ControllerClosedError("the controller is closed") from None
        try:
            return await future
        except asyncio.CancelledError:
            if scopes:
                # The trio task may be anywhere in its work; cancelling its scope is trio's way
                # to stop it there. Scheduled, because trio state is touched only by trio.
                self._token.run_sync_soon(scopes[0].cancel)
            raise


def _settle(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


@final
class AioGoal:
    """A goal, awaitable from asyncio: ``await goal.wait()``."""

    def __init__(self, goal: Goal, bridge: Bridge):
        self._goal = goal
        self._bridge = bridge

    @property
    def backend(self) -> str:
        return self._goal.backend

    @property
    def generation(self) -> int:
        return self._goal.generation

    @property
    def done(self) -> bool:
        return self._goal.done

    async def wait(self) -> GoalOutcome:
        """As ``Goal.wait``: COMPLETED or SUPERSEDED, or ``GoalFailed`` raised."""
        return await self._bridge.call(self._goal.wait)


@final
class AioController:
    """The controller's API as asyncio coroutines. Reads (``status``, ``snapshot``) are plain
    calls: they only look at state, which both worlds share on their one thread."""

    def __init__(self, controller: Controller, bridge: Bridge):
        self._ctl = controller
        self._bridge = bridge

    async def deploy(
        self, name: str, backend_config: BackendConfig, replica_config: ReplicaConfig
    ) -> AioGoal:
        goal = await self._bridge.call(self._ctl.deploy, name, backend_config, replica_config)
        return AioGoal(goal, self._bridge)

    async def delete(self, name: str, *, force: bool = False) -> AioGoal:
        goal = await self._bridge.call(_delete, self._ctl, name, force)
        return AioGoal(goal, self._bridge)

    @overload
    def status(self) -> ControllerStatus: ...
    @overload
    def status(self, name: str) -> BackendStatus: ...
    def status(self, name: str | None = None) -> ControllerStatus | BackendStatus:
        return self._ctl.status() if name is None else self._ctl.status(name)

    def snapshot(self, name: str) -> BackendSnapshot:
        return self._ctl.snapshot(name)

    async def listen_for_change(
        self, snapshot_ids: Mapping[str, int] | None = None, *, all_backends: bool = False
    ) -> dict[str, BackendSnapshot]:
        return await self._bridge.call(_listen, self._ctl, snapshot_ids, all_backends)

    async def watch(self, name: str) -> AsyncIterator[BackendSnapshot]:
        """``async for snapshot in ctl.watch(name)``, as ``Controller.watch``."""
        stream = self._ctl.watch(name)
        while True:
            yield await self._bridge.call(stream.__anext__)


async def _delete(ctl: Controller, name: str, force: bool) -> Goal:
    return await ctl.delete(name, force=force)


async def _listen(
    ctl: Controller, snapshot_ids: Mapping[str, int] | None, all_backends: bool
) -> dict[str, BackendSnapshot]:
    return await ctl.listen_for_change(snapshot_ids, all_backends=all_backends)


@final
class Opening:
    """The asyncio side of a host starting up, whichever way trio runs: the facade arrives on
    `ready`; `request_stop` ends the host (from asyncio, through the trio token)."""

    def __init__(self, runtime: Runtime, store: Store, restart_policy: RestartPolicy | None):
        self.ready: asyncio.Future[AioController] = asyncio.get_running_loop().create_future()
        self.stop = trio.Event()
        self.host_args = (
            {"runtime": runtime, "store": store, "restart_policy": restart_policy},
            self._on_ready,
            self.stop,
        )
        self._token: trio.lowlevel.TrioToken | None = None

    def _on_ready(self, facade: AioController) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self.ready.set_result(facade)

    async def wait(
        self, ended: asyncio.Future[Any], reraise: Callable[[], object]
    ) -> AioController:
        """The facade, or, if the host ends first (a store it cannot read), its error:
        `reraise` raises what `ended` holds."""
        either: list[asyncio.Future[Any]] = [self.ready, ended]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not self.ready.done():
            self.ready.cancel()
            reraise()
            raise RuntimeError("the controller's trio side ended before it opened")
        return self.ready.result()

    def request_stop(self) -> None:
        if self._token is not None:
            self._token.run_sync_soon(self.stop.set)


async def host(
    open_kwargs: Mapping[str, Any],
    on_ready: Callable[[AioController], None],
    stop: trio.Event,
) -> None:
    """The trio side: open the controller, hand asyncio its facade, serve calls until `stop`,
    then close (leaving replicas running, as closing a controller always does)."""
    async with open_controller(**open_kwargs) as ctl, trio.open_nursery() as nursery:
        on_ready(AioController(ctl, Bridge(trio.lowlevel.current_trio_token(), nursery)))
        await stop.wait()
        nursery.cancel_scope.cancel()
