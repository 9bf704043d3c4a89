"""What a backend's status says of its failures: each failed start (the replica's error and
traceback) and the last error, until the backend is healthy again, when they are no longer
news (the events keep them)."""

from __future__ import annotations

import trio
import trio.testing

import controller
from controller import GoalOutcome
from controller.testing import FakeRuntime, FakeState

from ..conftest import RC, config, opened, settle


async def test_failures_leave_the_status_once_the_backend_is_healthy_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rt = FakeRuntime()
    trace = 'Traceback (most recent call last):\n  File "app.py", line 3\nValueError: bad port\n'
    async with opened(rt) as ctl:
        goal = await ctl.deploy("a", config(num_replicas=1), RC)
        await rt.wait_until(lambda r: bool(r.tags(FakeState.STARTING)))
        (first,) = rt.tags(FakeState.STARTING)
        rt.fail_start(first, "ValueError", "bad port", trace)
        await settle()
        status = ctl.status("a")
        assert (status.last_error, status.last_traceback) == ("ValueError: bad port", trace)
        (failed,) = status.failed_starts
        assert (failed.tag, failed.version, failed.error_type, failed.message) == (
            first,
            "v1",
            "ValueError",
            "bad port",
        )
        assert failed.traceback == trace
        assert ctl.summary("a").failed_starts == ()  # a summary leaves them out, as replicas

        # The next start (after the backoff) works: healthy, nothing stale left but the events.
        await rt.wait_until(lambda r: bool(r.tags(FakeState.STARTING)))
        rt.finish_start(rt.tags(FakeState.STARTING)[0])
        assert await goal.wait() is GoalOutcome.COMPLETED
        status = ctl.status("a")
        assert status.state is controller.BackendState.HEALTHY
        assert (status.last_error, status.last_traceback, status.failed_starts) == (None, None, ())
        assert [e.kind for e in status.events].count("StartFailed") == 1

        # A crash, told while it is replaced, and gone from the status once it is.
        (victim,) = rt.tags(FakeState.READY)
        rt.crash(victim, "segfault")
        await settle()
        assert ctl.status("a").last_error == "died: segfault"
        await rt.wait_until(lambda r: bool(r.tags(FakeState.STARTING)))
        rt.finish_start(rt.tags(FakeState.STARTING)[0])
        await settle()
        status = ctl.status("a")
        assert status.state is controller.BackendState.HEALTHY
        assert status.last_error is None


def test_a_failed_start_names_its_exception_only_when_its_error_has_one() -> None:
    def failed(error: str) -> controller.FailedStart:
        return controller.FailedStart("a#1", "v1", error, None, 0.0)

    assert (failed("ValueError: a: b").error_type, failed("ValueError: a: b").message) == (
        "ValueError",
        "a: b",
    )
    assert failed("pkg.mod.Err: x\ny").error_type == "pkg.mod.Err"
    killed = failed("worker process killed by SIGKILL")
    assert (killed.error_type, killed.message) == (None, "worker process killed by SIGKILL")
