"""No process outlives a failed deploy: whatever way a replica's start fails, its worker is killed
and reaped before the goal fails, so a program that ends on ``GoalFailed`` (the README's own
snippet, run where its module cannot be imported) leaves nothing behind. Real LocalRuntime
workers, real clock, every wait bounded."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
import trio

import controller

from ..workers import LIMIT_S, worker_pids

HERE = Path(__file__).parent.parent

#: One failed start fails the deploy; no backoff to wait through.
ONE_TRY = controller.RestartPolicy(initial_delay_s=0, jitter=0, max_failed_starts=1)


@pytest.mark.parametrize(
    ("entrypoint", "kwargs", "expected"),
    [
        ("no_such_module:Echo", {}, "ModuleNotFoundError"),
        ("replicas:FailsInInit", {}, "ValueError: bad port"),
        ("replicas:SlowInit", {"seconds": 600}, "ReplicaStartTimeout"),
        ("replicas:FailsUnprintably", {}, r"Unprintable: <its str\(\) failed>"),
    ],
    ids=["import error", "__init__ raises", "hangs past the start timeout", "unprintable error"],
)
@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "spawned"])
async def test_a_failed_start_leaves_no_process_when_the_goal_fails(
    runtime_dir: Path,
    entrypoint: str,
    kwargs: dict[str, object],
    expected: str,
    fork_server: bool,
) -> None:
    runtime = controller.LocalRuntime(runtime_dir / "w", pythonpath=[HERE], fork_server=fork_server)
    store = controller.MemoryStore()
    # Only the start that hangs is to meet its timeout: the others fail of themselves, which
    # a loaded machine may take more than a few seconds to get to (seen beside two CPU hogs).
    timeout = 2 if expected == "ReplicaStartTimeout" else 60
    config = controller.BackendConfig(num_replicas=2, version="v1", start_timeout_s=timeout)
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(
            runtime=runtime, store=store, restart_policy=ONE_TRY
        ) as ctl:
            goal = await ctl.deploy(
                "a", config, controller.ReplicaConfig(entrypoint, init_kwargs=kwargs)
            )
            with pytest.raises(controller.GoalFailed, match=expected):
                await goal.wait()
            # At once, as a program that ends here would: the failed starts are gone.
            assert worker_pids(runtime_dir) == {}


@pytest.mark.parametrize(
    ("entrypoint", "first_line", "hint"),
    [
        (
            "no_such_module:Echo",
            "ModuleNotFoundError: No module named 'no_such_module'",
            "the entrypoint's module 'no_such_module' is not on the replicas' import path",
        ),
        (
            "missing_dependency_replica:Replica",
            "Traceback (most recent call last):\n"
            f'  File "{HERE / "missing_dependency_replica.py"}", line',
            "the entrypoint's code imports 'no_such_dependency_of_a_replica'",
        ),
    ],
    ids=["the entrypoint's module", "a module it imports"],
)
@pytest.mark.parametrize("fork_server", [True, False], ids=["forked", "spawned"])
async def test_a_module_not_found_says_where_replicas_import_from_and_shows_no_host_frame(
    runtime_dir: Path, entrypoint: str, first_line: str, hint: str, fork_server: bool
) -> None:
    runtime = controller.LocalRuntime(runtime_dir / "w", pythonpath=[HERE], fork_server=fork_server)
    config = controller.BackendConfig(num_replicas=1, version="v1")
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(
            runtime=runtime, store=controller.MemoryStore(), restart_policy=ONE_TRY
        ) as ctl:
            goal = await ctl.deploy("a", config, controller.ReplicaConfig(entrypoint))
            with pytest.raises(controller.GoalFailed) as failed:
                await goal.wait()
            shown = failed.value.traceback
            assert shown is not None
            assert ctl.status("a").last_traceback == shown
            # What status shows starts at the user's code (here: the error itself, when no
            # frame is theirs), after a line that says what was left out and where it is.
            left_out, _, rest = shown.partition("\n")
            assert re.fullmatch(
                r"\(\d+ frames of the replica's host, before its code, .*", left_out
            )
            assert rest.startswith(first_line), shown
            for host in ("site-packages/trio", "importlib", "controller/_", "hosting.py"):
                assert host not in rest, (host, shown)
            assert hint in rest
            assert f"--pythonpath: {HERE}" in rest
            assert "`controller run --pythonpath DIR`" in rest
            # The replica's log has the whole traceback, the host's frames and the hint too.
            (log,) = (runtime_dir / "w" / "logs").glob("a#*.log")
            whole = log.read_text()
            assert "controller/_ports/hosting.py" in whole
            assert "trio/_threads.py" in whole
            assert hint in whole


async def test_a_worker_whose_record_was_replaced_is_named_in_the_log_not_left_unsaid(
    runtime_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by an attack: a worker's spec file replaced by a link while no controller ran left
    # the worker running beside its replacement, and nothing said so. Its tag is only in that
    # file, so it is neither adopted nor stopped on a guess: the log names it, once.
    from controller._local.layout import spec_path

    def runtime() -> controller.LocalRuntime:
        return controller.LocalRuntime(runtime_dir / "w", pythonpath=[HERE], fork_server=False)

    store = controller.MemoryStore()
    trivial = controller.ReplicaConfig("replicas:Trivial")
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=runtime(), store=store) as ctl:
            await (await ctl.deploy("a", controller.BackendConfig(version="v1"), trivial)).wait()
            [tag] = [r.tag for r in ctl.status("a").replicas]
        [old] = worker_pids(runtime_dir)
        spec = trio.Path(spec_path(runtime_dir / "w", tag))
        elsewhere = trio.Path(runtime_dir / "elsewhere.json")
        await elsewhere.write_text(await spec.read_text())
        await spec.unlink()
        await spec.symlink_to(elsewhere)
        async with controller.open_controller(runtime=runtime(), store=store) as ctl:
            await ctl.wait_until(lambda c: c.status("a").state is controller.BackendState.HEALTHY)
            await (await ctl.delete("a")).wait()
    told = [r.getMessage() for r in caplog.records if f"worker pid {old} " in r.getMessage()]
    assert len(told) == 1, told
    assert "is neither adopted nor stopped" in told[0]
    assert f"{spec}" in told[0]
    assert "is a symlink" in told[0] or "Too many levels of symbolic links" in told[0]
    # What the log asks of a person; then until it is gone (its pidfd turns readable), so that
    # the fixture's look for leftover workers does not find it still dying.
    pidfd = os.pidfd_open(old)
    try:
        os.kill(old, signal.SIGKILL)
        with trio.fail_after(LIMIT_S):
            await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)
