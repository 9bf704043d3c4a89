"""kill -9: the daemon on LocalRuntime killed with SIGKILL in the middle of an apply and of a
rollout, then started again. It must converge, adopt the workers that live, and leave no
orphan or zombie process (the OS process table is checked). Real processes, real clock."""

from __future__ import annotations

import signal
from pathlib import Path

import trio

from ..daemons import LIMIT_S, Daemon, manifest, running, trivial
from ..workers import worker_pids


def slow(n: int, version: str) -> dict[str, object]:
    # Each worker takes a moment to build, so that the kill lands while starts are under way.
    return trivial(n, version, entrypoint="replicas:SlowInit", init_kwargs={"seconds": 0.5})


async def apply_then_kill_nine(daemon: Daemon, file: Path, when: bytes) -> None:
    """Apply `file` (not waiting), then SIGKILL the daemon as soon as its log shows `when`."""
    assert (await daemon.cli("apply", "-f", str(file))).returncode == 0
    await daemon.logged(when)
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGKILL)
    assert await daemon.process.wait() == -signal.SIGKILL


async def converged(daemon: Daemon, state_dir: Path, version: str, n: int) -> dict[int, str]:
    result = await daemon.cli("wait", "a")
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    status = (await daemon.status())["a"]
    assert status["counts_by_version"] == {version: {"RUNNING": n}}
    workers = worker_pids(state_dir)
    assert len(workers) == n, workers  # no orphan: every worker is one the status shows
    assert "Z" not in workers.values(), workers  # no zombie
    return workers


async def test_sigkill_in_the_middle_of_an_apply(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=slow(4, "v1")))
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery)
            await apply_then_kill_nine(first, file, b"backend a: starting 4")
            before = set(worker_pids(state_dir))  # whatever the kill left, half-built or not
            print(f"workers alive at the kill: {len(before)}")
        async with running(state_dir) as second:
            after = await converged(second, state_dir, "v1", 4)
            # Workers that were alive were adopted, not started again.
            assert before <= set(after)


async def test_sigkill_in_the_middle_of_a_rollout(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=slow(4, "v1")))
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery)
            assert (await first.cli("apply", "-f", str(file), "--wait")).returncode == 0
            v1 = set(worker_pids(state_dir))
            file.write_text(manifest(a=slow(4, "v2")))
            # Killed at the first decision of the rollout.
            await apply_then_kill_nine(first, file, b"(version v2)")
        async with running(state_dir) as second:
            after = await converged(second, state_dir, "v2", 4)
            assert not (v1 & set(after)), "a v1 worker outlived the rollout"
