"""What a backend's reducer leaves to its executor (``Due``) is started once: found by a review
of the change that took task starts out of the reducer, where a replica that died while
starting was stopped for its death and again for its failed start, when both came in one
burst (two kills, and a second Stopped)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import trio
import trio.testing

from controller._backend import tasks
from controller.testing import FakeRuntime, FakeState

from ..conftest import RC, config, opened


async def test_a_replica_that_dies_while_starting_is_stopped_once(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    stops: Counter[str] = Counter()
    real = tasks.Launcher._stop_soon

    def counted(self: tasks.Launcher, replica: Any, grace_s: float) -> None:
        stops[replica.tag] += 1
        real(self, replica, grace_s)

    monkeypatch.setattr(tasks.Launcher, "_stop_soon", counted)
    runtime = FakeRuntime()

    def starting(rt: FakeRuntime) -> list[str]:
        return [t for t, r in rt.replicas.items() if r.state is FakeState.STARTING]

    async with opened(runtime) as ctl:
        await ctl.deploy("a", config(num_replicas=1), RC)
        await runtime.wait_until(lambda rt: bool(starting(rt)))
        (tag,) = starting(runtime)
        runtime.crash(tag, "died while starting")  # its Died, then its failed start
        await ctl.wait_until(lambda c: tag not in {r.tag for r in c.status("a").replicas})
        await trio.testing.wait_all_tasks_blocked()
        assert stops[tag] == 1, stops
