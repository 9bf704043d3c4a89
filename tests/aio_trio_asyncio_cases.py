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

from .aio_scenarios import (
    RC,
    bridge_tasks,
    cfg,
    deploy_and_wait,
    errors_cross_with_their_type,
    watch_a_scale_up,
)

EXACT = controller.RestartPolicy(jitter=0)


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
    await in_asyncio(rt, deploy_and_wait)
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
    await in_asyncio(FakeRuntime(auto_ready=True), watch_a_scale_up)


async def test_cancellation_both_ways(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime()
    after_close: list[asyncio.Future[controller.GoalOutcome]] = []

    async def body(ctl: AioController) -> None:
        goal = await ctl.deploy("a", cfg(1), RC)
        # asyncio -> trio: a timeout in asyncio cancels the trio wait under it.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(goal.wait(), 5)

        assert await bridge_tasks(ctl) == 1  # only the count itself
        # trio -> asyncio: a wait still pending when the controller closes fails with
        # ControllerClosedError (checked below, after the close).
        after_close.append(asyncio.ensure_future(goal.wait()))
        await asyncio.sleep(1)

    await in_asyncio(rt, body)
    [pending] = after_close
    assert isinstance(pending.exception(), controller.ControllerClosedError)


async def test_errors_cross_with_their_type(autojump_clock: trio.testing.MockClock) -> None:
    await in_asyncio(
        FakeRuntime(auto_ready=True, capacity={"CPU": 1}), errors_cross_with_their_type
    )
