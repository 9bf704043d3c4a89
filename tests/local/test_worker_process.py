"""One worker process's end, awaited by more than one task: a stop and the monitor both wait for
it when a worker dies as it is being stopped. Real child processes; every wait bounded."""

from __future__ import annotations

import os
import signal
import sys

import trio
import trio.testing

from controller._local.process import WorkerProcess

from ..workers import LIMIT_S


def sleeper() -> WorkerProcess:
    """A child of ours that sleeps, held as a worker is (reaped by the one that sees it end)."""
    argv = [sys.executable, "-c", "import time; time.sleep(600)"]
    pid = os.posix_spawn(
        sys.executable, argv, dict(os.environ), setsid=True
    )  # a group, as workers are
    return WorkerProcess("a#1", pid, os.pidfd_open(pid))


async def test_two_tasks_waiting_for_one_end_both_see_it() -> None:
    # Found by an attack: trio lets one task wait on a descriptor; the second waiter raised
    # BusyResourceError, and the daemon died of it.
    worker = sleeper()
    ended: list[str] = []
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:

            async def wait(who: str) -> None:
                await worker.wait_exit(None)
                ended.append(who)

            nursery.start_soon(wait, "monitor")
            nursery.start_soon(wait, "stop")
            await trio.testing.wait_all_tasks_blocked()
            os.kill(worker.pid, signal.SIGKILL)
    assert sorted(ended) == ["monitor", "stop"]
    assert worker.exited
    assert worker.exit_status is not None  # reaped once, by the first
    worker.close()


async def test_a_waiter_that_finds_the_worker_forgotten_touches_no_descriptor() -> None:
    worker = sleeper()
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.terminate, 5.0, None)
            await trio.testing.wait_all_tasks_blocked()
        worker.close()  # the stop forgets it: its pidfd is closed (and may be reused)
        assert worker.pidfd == -1
        # The monitor's wait comes after: it returns at once, reading nothing.
        assert await worker.wait_end(None) != ""
    assert worker.exit_status is not None  # ended, and reaped by the stop
