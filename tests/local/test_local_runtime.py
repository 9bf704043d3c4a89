"""LocalRuntime with real worker processes and the real clock; every wait bounded by fail_after.

Workers are spawned here (``fork_server=False``), so that each test takes one path for sure;
tests/local/test_fork_server.py runs workers forked by the fork server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

import controller
import controller.testing
from controller import GoalOutcome
from controller._local.own_load import LOAD_HUNG_S, LOAD_SAMPLE_S
from controller._local.user_calls import call
from controller._local.wire import LineStream
from controller._local.worker import Worker
from controller._ports.wrap import RuntimeWrapper

from ..replicas import events
from ..workers import LIMIT_S, Harness, all_running, is_zombie_or_gone, worker_pids

HERE = Path(__file__).parent.parent
T = TypeVar("T")


async def serving(ctl: controller.Controller, name: str, count: int) -> controller.BackendSnapshot:
    snapshot = ctl.snapshot(name)
    while len(snapshot.replicas) != count:
        snapshot = (await ctl.listen_for_change({name: snapshot.snapshot_id}))[name]
    return snapshot


def cfg(**kwargs: object) -> controller.BackendConfig:
    kwargs.setdefault("version", "v1")
    return controller.BackendConfig(**kwargs)


async def test_start_to_ready_in_own_session(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            goal = await ctl.deploy(
                "a", cfg(num_replicas=2, user_config={"n": 1}), harness.recorder()
            )
            assert await goal.wait() is GoalOutcome.COMPLETED
            pids = worker_pids(harness.runtime_dir)
            assert len(pids) == 2
            for pid in pids:
                assert os.getsid(pid) == pid  # own session, own process group
                assert os.getpgid(pid) == pid
            replicas = ctl.status("a").replicas
            assert all(r.address and r.address.startswith("127.0.0.1:") for r in replicas)
            recorded = events(harness.record)
            assert sorted(e["pid"] for e in recorded if e["what"] == "init") == sorted(pids)
            # The user config reached each replica before it counted as ready.
            assert [e["config"] for e in recorded if e["what"] == "reconfigure"] == [{"n": 1}] * 2
            await (await ctl.delete("a")).wait()
        assert worker_pids(harness.runtime_dir) == {}


async def test_reconfigure_in_place_keeps_the_process(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", cfg(user_config=1), harness.recorder())).wait()
            (pid,) = worker_pids(harness.runtime_dir)
            await (await ctl.deploy("a", cfg(user_config=2), harness.recorder())).wait()
            assert list(worker_pids(harness.runtime_dir)) == [pid]
            configs = [e["config"] for e in events(harness.record) if e["what"] == "reconfigure"]
            assert configs == [1, 2]
            await (await ctl.delete("a", force=True)).wait()


async def test_health_check(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("ok", cfg(), harness.recorder())).wait()
            await (await ctl.deploy("sick", cfg(), harness.recorder(healthy=False))).wait()
            (ok,) = [r.tag for r in ctl.status("ok").replicas]
            (sick,) = [r.tag for r in ctl.status("sick").replicas]
            await harness.runtime.check_health_replica(ok)
            with pytest.raises(controller.ReplicaError, match="RuntimeError: unhealthy on purpose"):
                await harness.runtime.check_health_replica(sick)
            await (await ctl.delete("ok", force=True)).wait()
            await (await ctl.delete("sick", force=True)).wait()


async def test_drain_honoured(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            config = cfg(graceful_shutdown_timeout_s=20)
            await (await ctl.deploy("a", config, harness.recorder(drain_s=0.3))).wait()
            t0 = trio.current_time()
            await (await ctl.delete("a")).wait()
            took = trio.current_time() - t0
            assert [e["what"] for e in events(harness.record)][-2:] == ["drain", "drained"]
            # Waited for the drain, not for the 20 s grace (the margin: a machine at load 20).
            assert 0.3 <= took < 15


async def test_ignored_drain_is_killed_at_the_deadline(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            config = cfg(graceful_shutdown_timeout_s=1.0)
            await (await ctl.deploy("a", config, harness.recorder(drain_s=600))).wait()
            (pid,) = worker_pids(harness.runtime_dir)
            t0 = trio.current_time()
            await (await ctl.delete("a")).wait()
            took = trio.current_time() - t0
            # Not before the deadline; and killed there, not at the end of its 600 s drain (the
            # upper bound is that, generous: a machine at load 20 reaps late).
            assert 1.0 <= took < 30
            assert "drained" not in [e["what"] for e in events(harness.record)]
            assert is_zombie_or_gone(pid) == "gone"


async def test_init_error_reaches_the_goal(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            goal = await ctl.deploy("a", cfg(), controller.ReplicaConfig("replicas:FailsInInit"))
            with pytest.raises(controller.GoalFailed, match="ValueError: bad port"):
                await goal.wait()
            assert ctl.status("a").last_error == "ValueError: bad port"
            await (await ctl.delete("a")).wait()


async def test_a_worker_that_dies_at_start_says_how(harness: Harness) -> None:
    """Found by a newcomer: with `os:abort` the only word was "WorkerDied: socket connection
    broken: Connection reset by peer", the replica's log empty. Now the exit signal, Python's
    own words for the fault, and its traceback (faulthandler, in the log)."""
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            replica = controller.ReplicaConfig("replicas:AbortsInInit")
            goal = await ctl.deploy("a", cfg(), replica)
            with pytest.raises(controller.GoalFailed):
                await goal.wait()
            status = ctl.status("a")
            assert status.last_error == (
                "WorkerDied: worker process killed by SIGABRT (Fatal Python error: Aborted) "
                "while starting"
            ), status.last_error
            failed = status.failed_starts[-1]
            assert failed.traceback is not None
            assert "in __init__" in failed.traceback, failed.traceback
            await (await ctl.delete("a")).wait()


async def test_bad_entrypoint_fails_without_a_retry_storm(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            goal = await ctl.deploy("a", cfg(num_replicas=2), controller.ReplicaConfig("nosuch:X"))
            with pytest.raises(controller.GoalFailed, match="ModuleNotFoundError: No module named"):
                await goal.wait()
            # Every start keeps its log under its tag: three failed starts, and at most the one
            # already in flight when the goal failed.
            started = harness.runtime.log_tags("a")
            assert 3 <= len(started) <= 4
            # A storm would start more within half a second; the backoff starts none.
            with trio.move_on_after(0.5):
                await ctl.wait_until(lambda c: len(harness.runtime.log_tags("a")) > 4)
            assert len(harness.runtime.log_tags("a")) <= 4
            assert len(worker_pids(harness.runtime_dir)) <= 1
            await (await ctl.delete("a")).wait()


async def test_a_worker_killed_with_sigkill_is_replaced(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", cfg(num_replicas=2), harness.recorder())).wait()
            before = set(worker_pids(harness.runtime_dir))
            victim = min(before)
            os.kill(victim, signal.SIGKILL)
            await serving(ctl, "a", 1)
            # Said while it is replaced (the replacement waits out a backoff of a second).
            assert "killed by SIGKILL" in (ctl.status("a").last_error or "")
            await serving(ctl, "a", 2)
            after = set(worker_pids(harness.runtime_dir))
            assert victim not in after
            assert len(after) == 2
            assert len(after & before) == 1
            assert is_zombie_or_gone(victim) == "gone"
            await (await ctl.delete("a", force=True)).wait()


async def test_reopened_controller_adopts_live_workers(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", cfg(num_replicas=3), harness.recorder())).wait()
            pids = worker_pids(harness.runtime_dir)
        # The controller is gone; its workers are not.
        assert set(worker_pids(harness.runtime_dir)) == set(pids)
        runtime = controller.LocalRuntime(
            harness.runtime_dir / "w", pythonpath=[HERE], fork_server=False
        )
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            await all_running(ctl, "a")
            now = worker_pids(harness.runtime_dir)
            assert set(now) == set(pids)  # the same processes: none restarted, no duplicate
            assert set(now.values()) <= {"S", "R"}  # no zombie
            assert len([e for e in events(harness.record) if e["what"] == "init"]) == 3
            await (await ctl.delete("a", force=True)).wait()
        assert worker_pids(harness.runtime_dir) == {}
        assert all(is_zombie_or_gone(pid) == "gone" for pid in pids)


async def test_a_worker_no_intent_names_is_killed_on_reopen(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", cfg(num_replicas=1), harness.recorder())).wait()
        # Lose the intent: an empty store next to live workers.
        with controller.SQLiteStore(harness.runtime_dir / "other.db") as empty:
            runtime = controller.LocalRuntime(
                harness.runtime_dir / "w", pythonpath=[HERE], fork_server=False
            )
            # Orphans are killed in shielded tasks, so closing the controller waits for them.
            async with controller.open_controller(runtime=runtime, store=empty):
                pass
        assert worker_pids(harness.runtime_dir) == {}


async def test_closing_while_adopting_kills_nothing(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", cfg(num_replicas=3), harness.recorder())).wait()
        pids = worker_pids(harness.runtime_dir)
        # Closed at once, again and again, with the adoptions still in flight: the runtime
        # outlives the tasks that use it, so none mistakes the close for a failed replica.
        for _ in range(5):
            runtime = controller.LocalRuntime(
                harness.runtime_dir / "w", pythonpath=[HERE], fork_server=False
            )
            async with controller.open_controller(runtime=runtime, store=harness.store):
                pass
            assert set(worker_pids(harness.runtime_dir)) == set(pids)
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await serving(ctl, "a", 3)
            assert set(worker_pids(harness.runtime_dir)) == set(pids)
            await (await ctl.delete("a", force=True)).wait()


async def test_a_worker_inherits_nothing_of_the_controller_s_process(harness: Harness) -> None:
    # A listening socket made inheritable, as hypercorn makes its own, in the embedding app.
    with socket.socket() as app_socket:
        app_socket.bind(("127.0.0.1", 0))
        app_socket.listen()
        app_socket.set_inheritable(True)
        mine = f"socket:[{os.fstat(app_socket.fileno()).st_ino}]"
        with trio.fail_after(LIMIT_S):
            async with controller.open_controller(
                runtime=harness.runtime, store=harness.store
            ) as ctl:
                await (await ctl.deploy("a", cfg(), harness.recorder())).wait()
                (pid,) = worker_pids(harness.runtime_dir)
                targets = [
                    os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")
                ]
                assert mine not in targets
                assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
                await (await ctl.delete("a", force=True)).wait()


async def test_logs_are_named_by_tag_rotated_and_kept_within_bounds(harness: Harness) -> None:
    runtime = controller.LocalRuntime(
        harness.runtime_dir / "w",
        pythonpath=[HERE],
        log_max_bytes=1000,
        logs_kept=2,
        fork_server=False,
    )
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", cfg(), controller.ReplicaConfig("replicas:Talker"))).wait()
            (tag,) = [r.tag for r in ctl.status("a").replicas]
            assert runtime.log_path(tag) == harness.runtime_dir / "w" / "logs" / f"{tag}.log"
            # Reconfigured 100 times: about 1,700 bytes of output, past the 1,000 byte cap.
            for n in range(100):
                await runtime.reconfigure_replica(tag, n)
            chunk = runtime.read_log(tag, tail=3)
            assert chunk is not None
            assert chunk.text == "talker says 97\ntalker says 98\ntalker says 99\n"
            sizes = [p.stat().st_size for p in runtime.logs_dir.iterdir()]
            assert len(sizes) == 2  # the log and its one rotated part
            assert all(size <= 1000 for size in sizes)
            # Replace it four times: the logs of the two newest gone replicas are kept.
            for version in ("v2", "v3", "v4", "v5"):
                new = cfg(version=version)
                await (
                    await ctl.deploy("a", new, controller.ReplicaConfig("replicas:Talker"))
                ).wait()
            await trio.testing.wait_all_tasks_blocked()
            (live,) = [r.tag for r in ctl.status("a").replicas]
            kept = runtime.log_tags("a")
            assert live in kept
            assert tag not in kept
            assert len(kept) == 3
            await (await ctl.delete("a", force=True)).wait()


# An interpreter another user may run (this venv's may sit in root's private home).
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root and a system Python to run a process as another user",
)
async def test_a_process_of_another_user_posing_as_a_worker_is_ignored(
    harness: Harness,
) -> None:
    # What another local user could run: a command line naming our worker's spec file.
    home = Path(tempfile.mkdtemp(prefix="poser", dir="/tmp"))  # where that user may read
    os.chmod(home, 0o755)
    fake = home / "controller"
    fake.mkdir(mode=0o755)
    (fake / "__init__.py").write_text("")
    (fake / "worker.py").write_text("import time\ntime.sleep(120)\n")
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", cfg(), harness.recorder())).wait()
        (pid,) = worker_pids(harness.runtime_dir)
        (spec,) = (harness.runtime_dir / "w").glob("*.spec.json")
        poser = await trio.lowlevel.open_process(
            [SYSTEM_PYTHON, "-m", "controller.worker", str(spec)],
            cwd=home,  # `-m` looks there first: the fake package, not ours
            user=65534,
        )
        try:
            runtime = controller.LocalRuntime(
                harness.runtime_dir / "w", pythonpath=[HERE], fork_server=False
            )
            async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
                await all_running(ctl, "a")
                (replica,) = ctl.status("a").replicas
                assert replica.pid == pid  # the real worker, adopted
                await (await ctl.delete("a", force=True)).wait()
            assert poser.returncode is None  # not ours: neither adopted nor signalled
        finally:
            poser.kill()
            await poser.wait()
            shutil.rmtree(home)


async def test_a_worker_whose_replica_forks_is_adopted_not_its_child(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", cfg(), controller.ReplicaConfig("replicas:Forks"))).wait()
            (replica,) = ctl.status("a").replicas
        # The child shares the worker's command line; only the worker leads its session.
        runtime = controller.LocalRuntime(
            harness.runtime_dir / "w", pythonpath=[HERE], fork_server=False
        )
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            await all_running(ctl, "a")
            (adopted,) = ctl.status("a").replicas
            assert (adopted.tag, adopted.pid) == (replica.tag, replica.pid)
            await (await ctl.delete("a", force=True)).wait()


async def test_a_worker_that_died_while_no_controller_ran_leaves_nothing_behind(
    harness: Harness,
) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            await (await ctl.deploy("a", cfg(), harness.recorder())).wait()
            (old,) = ctl.status("a").replicas
        assert old.pid is not None
        os.kill(old.pid, signal.SIGKILL)
        await trio.to_thread.run_sync(os.waitpid, old.pid, 0)  # our child: reaped, as by init
        workdir = harness.runtime_dir / "w"
        runtime = controller.LocalRuntime(workdir, pythonpath=[HERE], fork_server=False)
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            await serving(ctl, "a", 1)
            await trio.testing.wait_all_tasks_blocked()
            (new,) = ctl.status("a").replicas
            assert new.tag != old.tag
            # One spec and one socket: the new replica's; the old one's log is kept.
            assert len(list(workdir.glob("*.spec.json"))) == 1
            assert len(list(workdir.glob("*.sock"))) == 1
            assert runtime.read_log(old.tag) is not None
            await (await ctl.delete("a", force=True)).wait()


def _pid_of(runtime_dir: Path, tag: str) -> int:
    for pid in worker_pids(runtime_dir):
        spec = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2]
        if tag in Path(spec.decode()).read_text():
            return pid
    raise AssertionError(f"no worker has tag {tag}")


@pytest.mark.parametrize("check", controller.testing.CONFORMANCE_CHECKS, ids=lambda c: c.__name__)
async def test_local_runtime_conforms(
    harness: Harness, check: Callable[[controller.testing.Subject], Awaitable[None]]
) -> None:
    async def crash(runtime: controller.Runtime, tag: str) -> None:
        os.kill(_pid_of(harness.runtime_dir, tag), signal.SIGKILL)
        await trio.lowlevel.checkpoint()

    subject = controller.testing.Subject(
        runtime=lambda: controller.LocalRuntime(
            harness.runtime_dir / "w", pythonpath=[HERE], fork_server=False
        ),
        store=harness.store,
        replica=harness.recorder(),
        ignores_drain=harness.recorder(drain_s=600),
        crash=crash,
    )
    with trio.fail_after(LIMIT_S):
        await check(subject)


class KillWatch(RuntimeWrapper):
    """Tells when a kill has begun."""

    def __init__(self, inner: controller.Runtime) -> None:
        super().__init__(inner)
        self.killing = trio.Event()

    async def around(self, op: str, tag: str | None, work: Callable[[], Awaitable[T]]) -> T:
        if op == "kill":
            self.killing.set()
        return await work()


async def test_closing_the_controller_during_a_kill_lets_the_kill_finish(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    watch = KillWatch(harness.runtime)
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=watch, store=harness.store) as ctl:
            replica = controller.ReplicaConfig(
                "replicas:IgnoresTerm", init_kwargs={"path": harness.record}
            )
            await (await ctl.deploy("a", cfg(), replica)).wait()
            (pid,) = worker_pids(harness.runtime_dir)
            await ctl.delete("a", force=True)
            await watch.killing.wait()
            # Closed while the kill waits for SIGTERM to be ignored, then sends SIGKILL.
    assert is_zombie_or_gone(pid) == "gone"
    assert "kill failed" not in caplog.text


async def test_a_worker_answers_while_a_slow_import_runs(runtime_dir: Path) -> None:
    barrier = runtime_dir / "imported"
    env = {**os.environ, "SLOW_IMPORT_BARRIER": str(barrier)}
    runtime = controller.LocalRuntime(
        runtime_dir / "w", pythonpath=[HERE], env=env, fork_server=False
    )
    store = controller.MemoryStore()
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=runtime, store=store) as ctl:
            replica = controller.ReplicaConfig("slow_import_replica:Slow")
            goal = await ctl.deploy("a", cfg(), replica)
            (tag,) = [r.tag for r in ctl.status("a").replicas]
            while True:  # until its process is there: spawning takes a moment
                try:
                    # Its import runs in a thread: the worker's loop answers meanwhile.
                    with trio.fail_after(5):
                        hello = await runtime._request(tag, {"op": "hello"})  # the worker's wire
                    break
                except controller.ReplicaGoneError:
                    await trio.sleep(0.01)
            assert hello["state"] == "starting"
            barrier.touch()
            assert await goal.wait() is GoalOutcome.COMPLETED
            await (await ctl.delete("a", force=True)).wait()


class _Counting:
    """A replica whose load changes at every sample."""

    def __init__(self) -> None:
        self.count = 5

    async def load(self) -> int:
        self.count += 1
        return self.count


@contextlib.asynccontextmanager
async def _pushing(worker: Worker) -> AsyncIterator[trio.SocketStream]:
    """`worker` serving a monitor connection and pushing its load; yields the runtime's end."""
    ours, theirs = trio.socket.socketpair()
    async with (
        trio.SocketStream(ours) as near,
        trio.SocketStream(theirs) as far,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(worker.monitor, LineStream(near))
        nursery.start_soon(worker.push_load)
        yield far
        nursery.cancel_scope.cancel()


async def test_a_monitor_attached_while_the_load_changes_does_not_end_the_worker() -> None:
    # Found by an audit: a monitor's first send (the load a restarted controller must hear) and
    # push_load's send of a changed load could meet on one stream, and trio's BusyResourceError
    # ended the worker, at the very takeover that is meant to leave it running. Trio picks the
    # order of the two tasks at random: each round is a new coin.
    for _ in range(20):
        worker = Worker({"tag": "t#1", "epoch": 0})
        worker.instance, worker.load = _Counting(), 1
        async with _pushing(worker) as far:
            received = b""
            while received.count(b"\n") < 2:  # the first load, and a changed one
                received += await far.receive_some(4096)
        loads = [json.loads(line)["load"] for line in received.splitlines()]
        assert len(loads) >= 2, received
        assert all(isinstance(n, int) for n in loads), received


class _Saying:
    """A replica whose ``load()`` returns what the test last put in `said`."""

    def __init__(self) -> None:
        self.said: object = 0

    def load(self) -> object:
        return self.said


async def test_a_load_past_the_largest_whole_number_says_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by a trial: 2**31 and 10**30 were cut to 2**31-1, which drove an autoscaler to its
    # maximum; the README says a load outside 0 to 2**31-1 counts as saying nothing.
    worker = Worker({"tag": "t#1", "epoch": 0})
    instance = worker.instance = _Saying()
    heard: list[int | None] = []
    async with _pushing(worker) as far:
        lines = LineStream(far)
        # Each differs from the one before as the worker pushes it (a push is of a change).
        for said in (7, 2**31, 2**31 - 1, 10**30, 3, -1):
            instance.said = said
            heard.append((await lines.receive())["load"])
    assert heard == [7, None, 2**31 - 1, None, 3, None]


class _Hanging:
    """A replica whose async ``load()`` waits for `go`, then says `said` (async, so that the
    test's clock is trio's alone: a sync one would run in a thread the mock clock cannot see)."""

    def __init__(self) -> None:
        self.said = 5
        self.go = trio.Event()
        self.go.set()

    async def load(self) -> int:
        await self.go.wait()
        return self.said


async def test_a_load_that_hangs_says_nothing_until_it_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Found by a trial: a load() that hung kept its last figure for good, holding an autoscaler
    # where it was. It now says nothing once a call has not returned within LOAD_HUNG_S.
    worker = Worker({"tag": "t#1", "epoch": 0})
    instance = worker.instance = _Hanging()
    heard: list[tuple[int | None, float]] = []
    # Virtual seconds: a worker that never says None would otherwise be waited for ever.
    with trio.fail_after(30):
        async with _pushing(worker) as far:
            lines = LineStream(far)
            heard.append(((await lines.receive())["load"], 0.0))
            instance.go = trio.Event()
            began = trio.current_time()
            heard.append(((await lines.receive())["load"], trio.current_time() - began))
            instance.said = 6
            instance.go.set()
            heard.append(((await lines.receive())["load"], 0.0))
    assert [load for load, _ in heard] == [5, None, 6], heard
    # Said once the call has not returned for LOAD_HUNG_S (begun within a sample of the hang).
    assert LOAD_HUNG_S <= heard[1][1] <= LOAD_HUNG_S + LOAD_SAMPLE_S


async def test_a_plain_method_that_returns_a_coroutine_has_it_awaited() -> None:
    # Found by a trial: trio refused the thread's result with "Trio expected a sync function,
    # but 'call.<locals>.<lambda>' appears to be asynchronous", naming nothing of the user's.
    async def answer() -> int:
        await trio.lowlevel.checkpoint()
        return 7

    class Replica:
        def check_health(self) -> Coroutine[Any, Any, int]:
            return answer()

    assert await call(Replica().check_health) == 7
