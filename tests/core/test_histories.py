"""Random histories: hypothesis draws a history one step at a time, each step chosen from the
state so far (which replica to crash, which pending start to finish or fail), and runs it under
MockClock against FakeRuntime: deploys, scales, version and config changes, deletes, crashes,
hung and failing starts, hung drains, failing health checks, time passing, and controller
restarts. After every step the controller and the runtime must agree; once the history quiets,
every backend converges and every goal is resolved.

Each example is one trio run driven by ``st.data()``: hypothesis shrinks a failing history to
a short one, and failures found are kept below as ``@example`` regressions.
"""

from __future__ import annotations

import os
import unittest.mock

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import controller
from controller._backend import pages
from controller._backend.pages import PAGE_SIZE
from controller._model.records.checkpoint import parse_all
from controller.testing import FakeRuntime

from ..conftest import DEADLOCK_LIMIT_S, EXACT, FIGURES
from ..histories import check_agreement, quiet, step

STEPS = 30
#: ``nox -s reliability`` sets it to 10 for ten times the histories.
EXAMPLES = 300 * int(os.environ.get("RELIABILITY_SCALE", "1"))
RAN = {"histories": 0, "steps": 0}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_random_histories(data: st.DataObject) -> None:
    # Pages of 3 spread the replicas of most histories over several (their keys written and
    # deleted as replicas come and go, read back by each restart).
    page_size = data.draw(st.sampled_from([PAGE_SIZE, 3]), label="page size")

    async def main() -> None:
        rt = FakeRuntime(auto_ready=False, auto_drain=False)
        store = controller.MemoryStore()
        latest: dict[str, object] = {}  # what the user last asked for, per backend
        steps = data.draw(st.integers(1, STEPS), label="steps")
        with trio.fail_after(DEADLOCK_LIMIT_S):
            restarts = data.draw(st.integers(0, 3), label="restarts")
            for life in range(restarts + 1):
                async with controller.open_controller(
                    runtime=rt, store=store, restart_policy=EXACT, seed=0
                ) as ctl:
                    for _ in range(steps // (restarts + 1)):
                        await step(data, ctl, rt, latest)
                        await trio.testing.wait_all_tasks_blocked()
                        check_agreement(ctl, rt)
                        RAN["steps"] += 1
                    if life == restarts:
                        await quiet(ctl, rt, latest)
                parse_all(dict(store.data))  # refuses a page no record lists
        RAN["histories"] += 1
        FIGURES["random histories"] = f"{RAN['histories']} histories, {RAN['steps']} steps"

    with unittest.mock.patch.object(pages, "PAGE_SIZE", page_size):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
