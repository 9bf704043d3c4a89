"""Guest mode: the controller in a stock asyncio loop. Run in a process of their own by
test_aio.py, because this way needs a process that never imported trio_asyncio."""

from __future__ import annotations

import asyncio
import sys

import pytest

import controller
from controller.aio import AioController, open_in_guest_mode
from controller.testing import FakeRuntime, FakeState

RC = controller.ReplicaConfig("m:C")


def cfg(n: int, **kwargs: object) -> controller.BackendConfig:
    return controller.BackendConfig(num_replicas=n, version="v1", **kwargs)  # type: ignore[arg-type]


async def children(ctl: AioController) -> int:
    """How many trio tasks the bridge runs now (itself included)."""

    async def count() -> int:
        return len(ctl._bridge._nursery.child_tasks)

    return await ctl._bridge.call(count)


def test_deploy_and_wait_from_asyncio() -> None:
    async def main() -> None:
        rt = FakeRuntime(auto_ready=True)
        async with open_in_guest_mode(runtime=rt, store=controller.MemoryStore()) as ctl:
            goal = await ctl.deploy("a", cfg(2), RC)
            assert await goal.wait() is controller.GoalOutcome.COMPLETED
            assert ctl.status("a").message == "2/2 replicas of version v1 running"
            assert len(rt.tags(FakeState.READY)) == 2

    asyncio.run(main())
    assert "trio_asyncio" not in sys.modules


def test_watch_from_asyncio() -> None:
    async def main() -> None:
        rt = FakeRuntime(auto_ready=True)
        async with open_in_guest_mode(runtime=rt, store=controller.MemoryStore()) as ctl:
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
            assert seen[0] == 1
            assert seen[-1] == 3
            changed = await ctl.listen_for_change({"a": 0})
            assert len(changed["a"].replicas) == 3

    asyncio.run(main())


def test_cancelling_the_asyncio_caller_cancels_the_trio_work() -> None:
    async def main() -> None:
        rt = FakeRuntime()  # starts hang until the test finishes them: the goal never ends
        async with open_in_guest_mode(runtime=rt, store=controller.MemoryStore()) as ctl:
            goal = await ctl.deploy("a", cfg(1), RC)
            waiting = asyncio.ensure_future(goal.wait())
            await asyncio.sleep(0.05)
            assert await children(ctl) == 2  # the goal's wait, and this count
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await asyncio.sleep(0.05)
            assert await children(ctl) == 1  # the trio side of the wait is gone

    asyncio.run(main())


def test_the_controller_closing_fails_the_asyncio_caller() -> None:
    async def main() -> None:
        rt = FakeRuntime()
        async with open_in_guest_mode(runtime=rt, store=controller.MemoryStore()) as ctl:
            goal = await ctl.deploy("a", cfg(1), RC)
            waiting = asyncio.ensure_future(goal.wait())
            await asyncio.sleep(0.05)
        # Leaving the block closed the controller under the wait: trio cancelled it.
        with pytest.raises(controller.ControllerClosedError):
            await waiting
        with pytest.raises(controller.ControllerClosedError):
            await ctl.deploy("b", cfg(1), RC)

    asyncio.run(main())


def test_errors_cross_the_bridge_with_their_type() -> None:
    async def main() -> None:
        rt = FakeRuntime(auto_ready=True, capacity={"CPU": 1})
        async with open_in_guest_mode(runtime=rt, store=controller.MemoryStore()) as ctl:
            with pytest.raises(controller.UnknownBackendError):
                await ctl.delete("nope")
            with pytest.raises(controller.InfeasibleError, match="cannot place 1 more"):
                await ctl.deploy("a", cfg(1, resources={"CPU": 2}), RC)
            with pytest.raises(controller.UnknownBackendError):
                ctl.status("a")  # the infeasible deploy changed nothing

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
