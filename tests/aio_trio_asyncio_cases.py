"""The trio-asyncio way: asyncio code on trio-asyncio's loop, inside trio. Run in a process of
their own by test_aio.py, because importing trio_asyncio changes asyncio for the whole process.

The tests are trio tests (pytest-trio) that open a trio-asyncio loop and run asyncio code in it;
with ``autojump_clock``, MockClock drives asyncio's time as well as trio's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing
import trio_asyncio

import controller
from controller.aio import AioController, open_under_trio_asyncio
from controller.testing import FakeRuntime, FakeState

RC = controller.ReplicaConfig("m:C")
EXACT = controller.RestartPolicy(jitter=0)


def cfg(n: int, **kwargs: object) -> controller.BackendConfig:
    return controller.BackendConfig(num_replicas=n, version="v1", **kwargs)  # type: ignore[arg-type]


async def in_asyncio(
    rt: FakeRuntime, body: Callable[[AioController], Awaitable[None]], *, policy: object = None
) -> None:
    """Run `body` as asyncio code, with a controller opened from asyncio, in a trio-asyncio loop."""

    async def app() -> None:
        async with open_under_trio_asyncio(
            runtime=rt,
            store=controller.MemoryStore(),
            restart_policy=policy or EXACT,  # type: ignore[arg-type]
        ) as ctl:
            await body(ctl)

    async with trio_asyncio.open_loop():
        await trio_asyncio.aio_as_trio(app)()


async def test_deploy_and_wait_from_asyncio(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime(auto_ready=True)

    async def body(ctl: AioController) -> None:
        goal = await ctl.deploy("a", cfg(2), RC)
        assert await goal.wait() is controller.GoalOutcome.COMPLETED
        assert ctl.status("a").message == "2/2 replicas of version v1 running"

    await in_asyncio(rt, body)
    assert len(rt.tags(FakeState.READY)) == 2  # left running by the close


async def test_mockclock_drives_both_worlds(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime()  # starts hang: each times out after start_timeout_s of virtual time

    async def body(ctl: AioController) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        goal = await ctl.deploy("a", cfg(1, start_timeout_s=30), RC)
        # Three starts time out (30 s each, 1 s and 2 s of backoff between): GoalFailed crosses
        # into asyncio with its type, after exactly that much virtual time.
        with pytest.raises(controller.GoalFailed, match="ReplicaStartTimeout"):
            await goal.wait()
        assert loop.time() - started == pytest.approx(93.0)
        assert trio.current_time() == pytest.approx(loop.time())
        await asyncio.sleep(3600)  # an hour of asyncio time, at once
        assert loop.time() - started == pytest.approx(3693.0)

    await in_asyncio(rt, body)


async def test_watch_from_asyncio(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime(auto_ready=True)

    async def body(ctl: AioController) -> None:
        await (await ctl.deploy("a", cfg(1), RC)).wait()
        seen: list[int] = []

        async def follow() -> None:
            async for snapshot in ctl.watch("a"):
                seen.append(len(snapshot.replicas))
                if len(snapshot.replicas) == 3:
                    return

        following = asyncio.ensure_future(follow())
        await (await ctl.deploy("a", cfg(3), RC)).wait()
        await asyncio.wait_for(following, 10)
        assert (seen[0], seen[-1]) == (1, 3)

    await in_asyncio(rt, body)


async def test_cancellation_both_ways(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime()
    after_close: list[asyncio.Future[controller.GoalOutcome]] = []

    async def body(ctl: AioController) -> None:
        goal = await ctl.deploy("a", cfg(1), RC)
        # asyncio -> trio: a timeout in asyncio cancels the trio wait under it.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(goal.wait(), 5)

        async def count() -> int:
            return len(ctl._bridge._nursery.child_tasks)

        assert await ctl._bridge.call(count) == 1  # only the count itself
        # trio -> asyncio: a wait still pending when the controller closes fails with
        # ControllerClosedError (checked below, after the close).
        after_close.append(asyncio.ensure_future(goal.wait()))
        await asyncio.sleep(1)

    await in_asyncio(rt, body)
    [pending] = after_close
    assert isinstance(pending.exception(), controller.ControllerClosedError)


async def test_errors_cross_with_their_type(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime(auto_ready=True, capacity={"CPU": 1})

    async def body(ctl: AioController) -> None:
        with pytest.raises(controller.UnknownBackendError):
            await ctl.delete("nope")
        with pytest.raises(controller.InfeasibleError):
            await ctl.deploy("a", cfg(1, resources={"CPU": 2}), RC)

    await in_asyncio(rt, body)
