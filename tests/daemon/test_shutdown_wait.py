"""What a daemon's shutdown says when it stops before its deletes are done: the log names the
cause (found by a loaded run, where a lease lost in the middle of a shutdown was logged as a
drain that took 80 s)."""

from __future__ import annotations

import contextlib
import logging

import pytest
import trio
import trio.testing

import controller
from controller._daemon.serve import _wait_deleted
from controller.testing import FakeRuntime

RC = controller.ReplicaConfig("app.replica:Echo")


def _opened() -> contextlib.AbstractAsyncContextManager[controller.Controller]:
    runtime = FakeRuntime(auto_ready=True)
    return controller.open_controller(runtime=runtime, store=controller.MemoryStore())


CONFIG = controller.BackendConfig(num_replicas=1, graceful_shutdown_timeout_s=5)


async def test_a_controller_that_stops_mid_shutdown_is_named_as_the_cause(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with _opened() as ctl:
        await (await ctl.deploy("a", CONFIG, RC)).wait()
        async with trio.open_nursery() as nursery:
            left: list[list[str]] = []

            async def wait() -> None:
                left.append(await _wait_deleted(ctl, trio.CancelScope()))

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            began = trio.current_time()
            ctl._close()  # what a lease it could not renew does to a leader
        assert trio.current_time() == began  # at once, not after the drain's limit
        assert left == [["a"]]
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert said == [
        "shutdown: a: the controller stopped before they were deleted; stopping anyway: their "
        "replicas keep running, and the next start finishes the deletes"
    ]


async def test_a_delete_past_the_longest_drain_is_named_with_its_limit(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with _opened() as ctl:
        await (await ctl.deploy("a", CONFIG, RC)).wait()
        began = trio.current_time()
        assert await _wait_deleted(ctl, trio.CancelScope()) == ["a"]  # never deleted
        took = trio.current_time() - began
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(said) == 1
    assert said[0].startswith(f"shutdown: a: still being deleted after {took:g}s;"), said
