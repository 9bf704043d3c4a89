"""asyncio code that both ways of embedding must run alike: the bodies shared by
aio_guest_cases.py and aio_trio_asyncio_cases.py (each runs in a process of its own)."""

from __future__ import annotations

import asyncio

import pytest

import controller
from controller.aio import AioController

RC = controller.ReplicaConfig("m:C")


def cfg(n: int, **kwargs: object) -> controller.BackendConfig:
    return controller.BackendConfig(num_replicas=n, version="v1", **kwargs)


async def bridge_tasks(ctl: AioController) -> int:
    """How many trio tasks the bridge runs now, this count's own included."""

    async def count() -> int:
        return len(ctl._bridge._nursery.child_tasks)

    return await ctl._bridge.call(count)


async def bridge_tasks_become(ctl: AioController, n: int) -> None:
    """Return once the bridge runs `n` trio tasks (each look is a round trip through trio, so
    the trio side runs in between: no sleep needed)."""
    while await bridge_tasks(ctl) != n:
        pass


async def deploy_and_wait(ctl: AioController) -> None:
    """Needs a runtime whose starts succeed at once."""
    goal = await ctl.deploy("a", cfg(2), RC)
    assert await goal.wait() is controller.GoalOutcome.COMPLETED
    assert ctl.status("a").message == "2/2 replicas of version v1 running"


async def watch_a_scale_up(ctl: AioController) -> None:
    """Needs a runtime whose starts succeed at once."""
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
    changed = await ctl.listen_for_change({"a": 0})
    assert len(changed["a"].replicas) == 3


async def errors_cross_with_their_type(ctl: AioController) -> None:
    """Needs a runtime with capacity {"CPU": 1}."""
    with pytest.raises(controller.UnknownBackendError):
        await ctl.delete("nope")
    with pytest.raises(controller.InfeasibleError, match="cannot place 1 more"):
        await ctl.deploy("a", cfg(1, resources={"CPU": 2}), RC)
    with pytest.raises(controller.UnknownBackendError):
        ctl.status("a")  # the infeasible deploy changed nothing
