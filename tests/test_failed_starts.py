"""No process outlives a failed deploy: whatever way a replica's start fails, its worker is killed
and reaped before the goal fails, so a program that ends on ``GoalFailed`` (the README's own
snippet, run where its module cannot be imported) leaves nothing behind. Real LocalRuntime
workers, real clock, every wait bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import controller

from .workers import LIMIT_S, worker_pids

HERE = Path(__file__).parent

#: One failed start fails the deploy; no backoff to wait through.
ONE_TRY = controller.RestartPolicy(initial_delay_s=0, jitter=0, max_failed_starts=1)


@pytest.mark.parametrize(
    ("entrypoint", "kwargs", "expected"),
    [
        ("no_such_module:Echo", {}, "ModuleNotFoundError"),
        ("replicas:FailsInInit", {}, "ValueError: bad port"),
        ("replicas:SlowInit", {"seconds": 600}, "ReplicaStartTimeout"),
    ],
    ids=["import error", "__init__ raises", "hangs past the start timeout"],
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
    config = controller.BackendConfig(num_replicas=2, version="v1", start_timeout_s=2)
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
