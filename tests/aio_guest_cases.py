"""Guest mode: the controller in a stock asyncio loop. Run in a process of their own by
test_aio.py, because this way needs a process that never imported trio_asyncio."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import pytest

import controller
from controller.aio import AioController, open_in_guest_mode
from controller.testing import FakeRuntime, FakeState

from .aio_scenarios import (
    RC,
    bridge_tasks_become,
    cfg,
    deploy_and_wait,
    errors_cross_with_their_type,
    watch_a_scale_up,
)


def in_guest_mode(rt: FakeRuntime, body: Callable[[AioController], Awaitable[None]]) -> None:
    async def main() -> None:
        async with open_in_guest_mode(runtime=rt, store=controller.MemoryStore()) as ctl:
            await body(ctl)

    asyncio.run(main())


def test_deploy_and_wait_from_asyncio() -> None:
    rt = FakeRuntime(auto_ready=True)
    in_guest_mode(rt, deploy_and_wait)
    assert len(rt.tags(FakeState.READY)) == 2  # left running by the close
    assert "trio_asyncio" not in sys.modules


def test_watch_from_asyncio() -> None:
    in_guest_mode(FakeRuntime(auto_ready=True), watch_a_scale_up)


def test_errors_cross_the_bridge_with_their_type() -> None:
    in_guest_mode(FakeRuntime(auto_ready=True, capacity={"CPU": 1}), errors_cross_with_their_type)


def test_cancelling_the_asyncio_caller_cancels_the_trio_work() -> None:
    async def main() -> None:
        rt = FakeRuntime()  # starts hang until the test finishes them: the goal never ends
        async with open_in_guest_mode(runtime=rt, store=controller.MemoryStore()) as ctl:
            goal = await ctl.deploy("a", cfg(1), RC)
            waiting = asyncio.ensure_future(goal.wait())
            # Until its trio task runs: the goal's wait, and this count (a round trip each).
            await asyncio.wait_for(bridge_tasks_become(ctl, 2), 10)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await asyncio.wait_for(bridge_tasks_become(ctl, 1), 10)  # the trio side is gone

    asyncio.run(main())


def test_the_controller_closing_fails_the_asyncio_caller() -> None:
    async def main() -> None:
        rt = FakeRuntime()
        async with open_in_guest_mode(runtime=rt, store=controller.MemoryStore()) as ctl:
            goal = await ctl.deploy("a", cfg(1), RC)
            waiting = asyncio.ensure_future(goal.wait())
            await asyncio.wait_for(bridge_tasks_become(ctl, 2), 10)
        # Leaving the block closed the controller under the wait: trio cancelled it.
        with pytest.raises(controller.ControllerClosedError):
            await waiting
        with pytest.raises(controller.ControllerClosedError):
            await ctl.deploy("b", cfg(1), RC)

    asyncio.run(main())


def test_shutdown_is_clean_and_leaves_the_replicas_running() -> None:
    rt = FakeRuntime(auto_ready=True)

    async def main() -> None:
        async with open_in_guest_mode(runtime=rt, store=controller.MemoryStore()) as ctl:
            await (await ctl.deploy("a", cfg(2), RC)).wait()
        # The guest run has ended: only this task is left in the loop.
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())
    assert len(rt.tags(FakeState.READY)) == 2  # closing a controller never stops replicas


def test_a_store_it_cannot_read_fails_the_open() -> None:
    store = controller.MemoryStore({"spec/a": "not json"})

    async def main() -> None:
        with pytest.raises(controller.CheckpointError):
            async with open_in_guest_mode(runtime=FakeRuntime(), store=store):
                raise AssertionError("opened over a corrupt store")

    asyncio.run(main())
