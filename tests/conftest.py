from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

import controller
from controller.testing import FakeRuntime, FakeState

RC = controller.ReplicaConfig("app.replica:Echo")

#: What the reliability suites counted (crash points, histories, inputs): printed at the end of
#: the run, for RELIABILITY.md (``nox -s reliability``).
FIGURES: dict[str, str] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("reliability figures")
        for what, figure in sorted(FIGURES.items()):
            terminalreporter.write_line(f"{what}: {figure}")


def config(**kwargs: object) -> controller.BackendConfig:
    kwargs.setdefault("version", "v1")
    return controller.BackendConfig(**kwargs)


#: Virtual seconds after which a test counts as deadlocked (a week: no test needs near that).
DEADLOCK_LIMIT_S = 7 * 24 * 3600

#: No jitter, so that backoff waits are exact under MockClock: 1 s, 2 s, 4 s... capped at 60 s.
EXACT = controller.RestartPolicy(jitter=0.0)


@asynccontextmanager
async def opened(
    runtime: controller.Runtime | None = None,
    store: controller.Store | None = None,
    policy: controller.RestartPolicy = EXACT,
) -> AsyncIterator[controller.Controller]:
    # A deadline far beyond any test's needs: under autojump_clock a test that deadlocks would
    # otherwise spin forever (with no deadline, there is nothing to jump to); with one, the clock
    # jumps there and the test fails with TooSlowError. On the real clock it never fires.
    with trio.fail_after(DEADLOCK_LIMIT_S):
        async with controller.open_controller(
            runtime=runtime if runtime is not None else FakeRuntime(auto_ready=True),
            store=store if store is not None else controller.MemoryStore(),
            restart_policy=policy,
            seed=0,
        ) as ctl:
            yield ctl


async def deploy_ready(
    ctl: controller.Controller, rt: FakeRuntime, cfg: controller.BackendConfig, name: str = "a"
) -> controller.Goal:
    """Deploy, finish every start by hand, and wait for the goal."""
    goal = await ctl.deploy(name, cfg, RC)
    await settle()
    for tag in rt.tags(FakeState.STARTING):
        rt.finish_start(tag)
    assert await goal.wait() is controller.GoalOutcome.COMPLETED
    return goal


async def serving(ctl: controller.Controller, name: str, count: int) -> None:
    """Wait until the controller's watch snapshot of `name` lists `count` replicas."""
    snapshot = ctl.snapshot(name)
    while len(snapshot.replicas) != count:
        snapshot = (await ctl.listen_for_change({name: snapshot.snapshot_id}))[name]


async def settle() -> None:
    """Let every task run until all are blocked (on the runtime, a timer or an event)."""
    await trio.testing.wait_all_tasks_blocked()
