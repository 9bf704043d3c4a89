"""The testing kit as its README section shows it: the example run as written, then each call of
the table, the way a user of the kit writes a test with it."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio
import trio.testing

import controller
from controller import BackendState, GoalOutcome, ReplicaState
from controller.testing import FakeRuntime
from controller.testing import FakeState as S

from ..documents import page

RC = controller.ReplicaConfig("m:C")


def readme_example() -> str:
    """The first Python block of the testing page (docs/testing.md)."""
    section = page("testing.md")
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


async def test_the_readme_example_runs_as_written(autojump_clock: trio.testing.MockClock) -> None:
    namespace: dict[str, Any] = {"FakeRuntime": FakeRuntime, "controller": controller, "trio": trio}
    exec(readme_example(), namespace)
    await namespace["test_ignored_drain_is_killed_at_the_deadline"](autojump_clock)


async def test_each_call_of_the_table(autojump_clock: trio.testing.MockClock) -> None:
    rt = FakeRuntime(auto_reconfigure=False, hung_drains={"m:Slow"})
    policy = controller.RestartPolicy(jitter=0)
    async with controller.open_controller(
        runtime=rt, store=controller.MemoryStore(), restart_policy=policy
    ) as ctl:
        one = controller.BackendConfig(num_replicas=1, version="v1", user_config=1)
        await ctl.deploy("a", one, RC)
        await ctl.deploy("b", one, controller.ReplicaConfig("m:Slow"))
        await rt.wait_until(lambda r: len(r.tags(S.STARTING)) == 2)
        (a,) = rt.tags(S.STARTING, backend="a")
        (b,) = rt.tags(S.STARTING, backend="b")
        assert rt.start_calls == 2
        rt.finish_start(a)
        rt.finish_start(b)

        # A reconfigure held open: UPDATING, seen on purpose, with the config on its way.
        await ctl.deploy(
            "a", controller.BackendConfig(num_replicas=1, version="v1", user_config=2), RC
        )
        await ctl.wait_until(lambda c: c.status("a").replicas[0].state is ReplicaState.UPDATING)
        await rt.wait_until(lambda r: r.replicas[a].reconfiguring == 2)
        rt.finish_reconfigure(a)
        await ctl.wait_until(lambda c: c.status("a").state is BackendState.HEALTHY)
        assert rt.replicas[a].reconfigure_calls == 1

        # A crash, then a failed start: both leave a stop time; backoff is exact with jitter=0.
        crashed_at = trio.current_time()
        rt.crash(a)
        assert rt.replicas[a].stopped_at == crashed_at
        await rt.wait_until(lambda r: len(r.tags(S.STARTING, backend="a")) == 1)
        assert trio.current_time() == crashed_at + policy.initial_delay_s
        (replacement,) = rt.tags(S.STARTING, backend="a")
        rt.fail_start(replacement, "ValueError", "bad port")
        assert rt.replicas[replacement].stopped_at == trio.current_time()

        # A goal that fails: FAILED, with the error as an exception.
        bad = controller.BackendConfig(num_replicas=1, version="v2")
        goal = await ctl.deploy("c", bad, RC)
        for _ in range(policy.max_failed_starts):
            await rt.wait_until(lambda r: bool(r.tags(S.STARTING, backend="c")))
            rt.fail_start(rt.tags(S.STARTING, backend="c")[0], "ValueError", "no")
        with pytest.raises(controller.GoalFailed):
            await goal.wait()
        assert goal.outcome is GoalOutcome.FAILED
        assert isinstance(goal.exception, controller.GoalFailed)

        # A drain that never ends on its own: killed at the deadline.
        await (await ctl.delete("b")).wait()
        assert rt.replicas[b].killed_at is not None
        assert rt.replicas[b].drain_requested_at is not None


async def test_a_hung_adoption_is_given_up_at_the_start_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime(auto_ready=True)
    store = controller.MemoryStore()
    config = controller.BackendConfig(num_replicas=1, start_timeout_s=30)
    async with controller.open_controller(runtime=rt, store=store) as ctl:
        await (await ctl.deploy("a", config, RC)).wait()
    (tag,) = rt.tags()
    rt.replicas[tag].adoption_hangs = True
    async with controller.open_controller(runtime=rt, store=store) as ctl:
        opened_at = trio.current_time()
        await ctl.wait_until(lambda c: tag not in {r.tag for r in c.status("a").replicas})
        assert trio.current_time() == opened_at + 30
        await ctl.wait_until(lambda c: c.status("a").state is BackendState.HEALTHY)
