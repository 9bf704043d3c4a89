"""LocalRuntime's fork server: workers forked by a zygote, with real processes and the real clock;
every wait bounded by fail_after, none a sleep.

Each test that wants forked workers waits for the fork server first (``wait_fork_server_ready``):
a start that comes before it is ready spawns its worker, which tests/local/test_local_runtime.py
covers."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import trio

import controller
import controller.testing
from controller import GoalOutcome

from ..conftest import config as cfg
from ..conftest import serving
from ..replicas import events
from ..workers import Harness, WaitsForTheForkServer, all_running, is_zombie_or_gone, worker_pids

HERE = Path(__file__).parent.parent
LIMIT_S = 30  # generous: CI machines are slow at starting Python


def naming(path: Path) -> set[int]:
    """Every live process whose command line names `path`: workers, spawned or forked, and
    fork servers."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if str(path).encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.add(int(entry))
    return found


def dying(pid: int) -> bool:
    """Whether `pid` is on its way out: SIGKILL pending, or exiting (PF_EXITING). A worker's
    kill signals its whole process group and waits for the worker alone: a child the replica
    forked can still be there a moment later, killed but not yet gone (seen on a busy CI)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # gone already
    flags = int(stat.rpartition(b")")[2].split()[6])
    pending = 0
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            pending |= int(line.split()[1], 16)
    return bool(flags & 0x4 or pending & 1 << (signal.SIGKILL - 1))


# In place of tests/conftest.py's: this one's clean-up finds a fork server too.
@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    # Short, because Unix socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="fs", dir="/tmp"))
    yield path
    leftovers = {pid for pid in naming(path) if not dying(pid)}
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)
    assert leftovers == set(), "a test left processes behind (workers or a fork server)"


def command_line(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def descriptors(pid: int) -> dict[int, str]:
    """What each descriptor of `pid` refers to (``socket:[inode]``, ``pipe:[...]``, a path)."""
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            found[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
    return found


def listening_unix_sockets() -> dict[str, str]:
    """Each listening Unix socket of this machine, ``socket:[inode]``, with its path."""
    found = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        # Flags 00010000 is __SO_ACCEPTCON: listening.
        if len(fields) >= 8 and fields[3] == "00010000":
            found[f"socket:[{fields[6]}]"] = fields[7]
    return found


def forked_pid(workdir: Path, tag: str) -> int:
    """The pid that the forked worker of `tag` wrote in its pid file."""
    for spec in workdir.glob("*.spec.json"):
        if json.loads(spec.read_text())["tag"] == tag:
            pid_file = Path(str(spec).removesuffix(".spec.json") + ".pid")
            return int(pid_file.read_text().split()[0])
    raise AssertionError(f"no spec has tag {tag}")


# In place of tests/conftest.py's: workers forked, not spawned.
@pytest.fixture
async def harness(runtime_dir: Path, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(runtime_dir, tmp_path / "events.jsonl", fork_server=True)
    yield h
    h.store.close()


async def test_a_worker_is_forked_by_the_fork_server_and_serves(harness: Harness) -> None:
    runtime = harness.runtime
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            assert await runtime.wait_fork_server_ready()
            zygote = runtime.fork_server_pid
            assert zygote is not None
            goal = await ctl.deploy(
                "a", cfg(num_replicas=2, user_config={"n": 1}), harness.recorder()
            )
            assert await goal.wait() is GoalOutcome.COMPLETED
            await (await ctl.deploy("sick", cfg(), harness.recorder(healthy=False))).wait()
            pids = worker_pids(harness.runtime_dir)
            assert len(pids) == 3
            for pid in pids:
                assert parent_of(pid) == zygote  # the other path: not our child
                assert os.getsid(pid) == pid  # own session, own process group
                assert os.getpgid(pid) == pid
            for replica in ctl.status("a").replicas:
                assert replica.pid == forked_pid(harness.workdir, replica.tag)
                await runtime.check_health_replica(replica.tag)
            (sick,) = [r.tag for r in ctl.status("sick").replicas]
            with pytest.raises(controller.ReplicaError, match="RuntimeError: unhealthy on purpose"):
                await runtime.check_health_replica(sick)
            recorded = events(harness.record)
            assert sorted(e["pid"] for e in recorded if e["what"] == "init") == sorted(pids)
            assert [e["config"] for e in recorded if e["what"] == "reconfigure"] == [{"n": 1}] * 2
            await (await ctl.delete("a")).wait()
            await (await ctl.delete("sick", force=True)).wait()
            assert worker_pids(harness.runtime_dir) == {}
            # Reaped by the fork server when asked, after the runtime read how they ended.
            assert all(is_zombie_or_gone(pid) == "gone" for pid in pids)
            # What they left behind is gone with them, their pid files too; logs stay.
            assert sorted(p.name for p in harness.workdir.iterdir()) == ["logs", "zygote.log"]
        assert is_zombie_or_gone(zygote) == "gone"  # killed and reaped when the runtime closed


async def test_a_forked_worker_killed_with_sigkill_is_a_death_with_its_signal(
    harness: Harness,
) -> None:
    runtime = harness.runtime
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            assert await runtime.wait_fork_server_ready()
            await (await ctl.deploy("a", cfg(num_replicas=2), harness.recorder())).wait()
            before = set(worker_pids(harness.runtime_dir))
            victim = min(before)
            os.kill(victim, signal.SIGKILL)
            await serving(ctl, "a", 1)
            assert "worker process killed by SIGKILL" in (ctl.status("a").last_error or "")
            # Its status was read, then the fork server reaped it: no zombie is left.
            assert is_zombie_or_gone(victim) == "gone"
            await serving(ctl, "a", 2)
            after = set(worker_pids(harness.runtime_dir))
            assert victim not in after
            assert len(after & before) == 1
            assert all(parent_of(pid) == runtime.fork_server_pid for pid in after)
            await (await ctl.delete("a", force=True)).wait()


async def test_the_stop_ladder_on_forked_workers(harness: Harness) -> None:
    # A wide ladder (5 s before SIGKILL): "at once" and "at the deadline" stay apart on a
    # machine at load 20, where a tight one's real-clock bounds did not.
    term_s = 5.0
    runtime = harness.local(term_timeout_s=term_s)
    stubborn = controller.ReplicaConfig(
        "replicas:IgnoresTerm", init_kwargs={"path": harness.record}
    )
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            deaths: list[tuple[str, str]] = []
            await nursery.start(runtime.serve, lambda tag, reason: deaths.append((tag, reason)))
            assert await runtime.wait_fork_server_ready()
            polite = controller.ReplicaSpec("a#1", "a", "v1", harness.recorder(), None, {})
            deaf = controller.ReplicaSpec("a#2", "a", "v1", stubborn, None, {})
            for spec in (polite, deaf):
                info = await runtime.start_replica(spec)
                assert info.pid is not None
                assert parent_of(info.pid) == runtime.fork_server_pid
            polite_pid = forked_pid(harness.workdir, "a#1")
            deaf_pid = forked_pid(harness.workdir, "a#2")
            # SIGTERM to the group: the default action ends it at once.
            t0 = trio.current_time()
            await runtime.kill_replica("a#1")
            assert trio.current_time() - t0 < term_s  # not the ladder's SIGKILL
            # SIGTERM ignored: SIGKILL after term_timeout_s (it would ignore SIGTERM for ever).
            t0 = trio.current_time()
            await runtime.kill_replica("a#2")
            took = trio.current_time() - t0
            assert term_s <= took < term_s + 20
            assert is_zombie_or_gone(polite_pid) == "gone"
            assert is_zombie_or_gone(deaf_pid) == "gone"
            assert deaths == []  # stops that are ours are no deaths
            nursery.cancel_scope.cancel()


async def test_a_reopened_runtime_adopts_forked_workers(harness: Harness) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            assert await harness.runtime.wait_fork_server_ready()
            zygote = harness.runtime.fork_server_pid
            await (await ctl.deploy("a", cfg(num_replicas=3), harness.recorder())).wait()
            pids = worker_pids(harness.runtime_dir)
            assert {parent_of(pid) for pid in pids} == {zygote}
        # The runtime closed: its fork server is gone, its workers are not.
        assert zygote is not None
        assert is_zombie_or_gone(zygote) == "gone"
        assert set(worker_pids(harness.runtime_dir)) == set(pids)
        assert zygote not in {parent_of(pid) for pid in pids}
        runtime = harness.local()
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            await all_running(ctl, "a")
            now = worker_pids(harness.runtime_dir)
            assert set(now) == set(pids)  # the same processes: none restarted, no duplicate
            assert set(now.values()) <= {"S", "R"}
            assert {r.pid for r in ctl.status("a").replicas} == set(pids)
            assert len([e for e in events(harness.record) if e["what"] == "init"]) == 3
            await (await ctl.delete("a", force=True)).wait()
        assert worker_pids(harness.runtime_dir) == {}


async def test_a_forked_worker_whose_replica_forks_is_adopted_not_its_child(
    harness: Harness,
) -> None:
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=harness.runtime, store=harness.store) as ctl:
            assert await harness.runtime.wait_fork_server_ready()
            await (await ctl.deploy("a", cfg(), controller.ReplicaConfig("replicas:Forks"))).wait()
            (replica,) = ctl.status("a").replicas
            assert replica.pid is not None
            assert parent_of(replica.pid) == harness.runtime.fork_server_pid
        # Its child has the fork server's command line too, but leads no session and is named
        # by no pid file.
        runtime = harness.local()
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            await all_running(ctl, "a")
            (adopted,) = ctl.status("a").replicas
            assert (adopted.tag, adopted.pid) == (replica.tag, replica.pid)
            await (await ctl.delete("a", force=True)).wait()


async def test_a_forked_worker_holds_only_its_own_descriptors(harness: Harness) -> None:
    # A listening socket made inheritable in the embedding app, as hypercorn makes its own.
    with socket.socket() as app_socket:
        app_socket.bind(("127.0.0.1", 0))
        app_socket.listen()
        app_socket.set_inheritable(True)
        mine = f"socket:[{os.fstat(app_socket.fileno()).st_ino}]"
        runtime = harness.runtime
        spawning = controller.LocalRuntime(
            harness.runtime_dir / "s", pythonpath=[HERE], fork_server=False
        )
        with trio.fail_after(LIMIT_S):
            async with trio.open_nursery() as nursery:
                await nursery.start(runtime.serve, lambda tag, reason: None)
                await nursery.start(spawning.serve, lambda tag, reason: None)
                assert await runtime.wait_fork_server_ready()
                zygote = runtime.fork_server_pid
                assert zygote is not None
                tags = ["a#1", "a#2"]
                for tag in tags:
                    await runtime.start_replica(
                        controller.ReplicaSpec(tag, "a", "v1", harness.recorder(), None, {})
                    )
                spawned = await spawning.start_replica(
                    controller.ReplicaSpec("b#1", "b", "v1", harness.recorder(), None, {})
                )
                assert spawned.pid is not None
                one, other = (forked_pid(harness.workdir, tag) for tag in tags)
                assert parent_of(one) == zygote
                theirs = descriptors(one)
                others = set(descriptors(other).values())
                ours = set(descriptors(os.getpid()).values())
                zygotes = set(descriptors(zygote).values())
                sockets = {t for t in theirs.values() if t.startswith("socket:")}
                # The three a spawned worker starts with (trio's capture of the output then
                # puts a pipe on 1 and 2), and nothing of anyone else's: not the controller's,
                # not the fork server's (its control socket, its log), not another worker's.
                assert theirs[0] == "/dev/null"
                assert theirs[1] == theirs[2]
                assert theirs[1].startswith("pipe:")
                assert mine not in theirs.values()
                assert not sockets & (ours | zygotes | others)
                assert not any(t.endswith("zygote.log") for t in theirs.values())
                # One listening socket: its own, at its own path.
                listening = listening_unix_sockets()
                (listener,) = [t for t in theirs.values() if t in listening]
                assert listening[listener].startswith(str(harness.workdir))
                assert listening[listener] not in {listening.get(t) for t in others}
                # Of the same kinds as a spawned worker's (the numbers vary with connections).
                assert _kinds(theirs) == _kinds(descriptors(spawned.pid))
                for tag in tags:
                    await runtime.kill_replica(tag)
                await spawning.kill_replica("b#1")
                nursery.cancel_scope.cancel()


def _kinds(fds: dict[int, str]) -> set[str]:
    def kind(target: str) -> str:
        if target.startswith("/") and target.endswith(".log"):
            return "its log"
        return target.split(":[")[0] if ":[" in target else target

    return {kind(t) for t in fds.values()}


async def test_without_the_fork_server_workers_are_spawned(harness: Harness) -> None:
    runtime = harness.local(fork_server=False)
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            assert not await runtime.wait_fork_server_ready()
            assert runtime.fork_server_pid is None
            await (await ctl.deploy("a", cfg(), harness.recorder())).wait()
            (pid,) = worker_pids(harness.runtime_dir)
            assert parent_of(pid) == os.getpid()
            assert b"controller.worker" in command_line(pid)
            assert naming(harness.workdir) == {pid}  # no fork server
            assert not list(harness.workdir.glob("*.pid"))
            await (await ctl.delete("a", force=True)).wait()


async def test_the_fork_server_dying_falls_back_to_spawning_then_restarts(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = harness.runtime
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            assert await runtime.wait_fork_server_ready()
            first = runtime.fork_server_pid
            assert first is not None
            await (await ctl.deploy("a", cfg(), harness.recorder())).wait()
            (forked,) = ctl.status("a").replicas
            assert forked.pid is not None
            assert parent_of(forked.pid) == first
            # The fork server is killed; wait until it is dead (its pidfd says), not longer.
            pidfd = os.pidfd_open(first)
            try:
                os.kill(first, signal.SIGKILL)
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
            # A start now spawns its worker, and does not fail.
            await (await ctl.deploy("b", cfg(), harness.recorder())).wait()
            (spawned,) = ctl.status("b").replicas
            assert spawned.pid is not None
            assert parent_of(spawned.pid) == os.getpid()
            await runtime.check_health_replica(spawned.tag)
            # A new fork server comes up, and forks the starts after.
            assert await runtime.wait_fork_server_ready()
            second = runtime.fork_server_pid
            assert second not in (None, first)
            await (await ctl.deploy("c", cfg(), harness.recorder())).wait()
            (again,) = ctl.status("c").replicas
            assert again.pid is not None
            assert parent_of(again.pid) == second
            # The worker of the dead fork server lives on, and is still the runtime's.
            await runtime.check_health_replica(forked.tag)
            for name in ("a", "b", "c"):
                await (await ctl.delete(name, force=True)).wait()
            assert worker_pids(harness.runtime_dir) == {}
    (warning,) = [r for r in caplog.records if "fork server" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert f"fork server (pid {first}) killed by SIGKILL" in warning.getMessage()


PRELOADS = {
    "raises": "raise ImportError('not here')\n",
    "starts_a_thread": "import threading, time\n"
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
    "keeps_a_file": "import os\nf = open(os.devnull)\n",
}


@pytest.mark.parametrize(
    ("module", "why"),
    [
        ("raises", "preloading 'raises' failed"),
        ("starts_a_thread", "2 threads"),
        ("keeps_a_file", "holds descriptors"),
    ],
)
async def test_a_fork_server_that_cannot_start_leaves_starts_to_spawning(
    harness: Harness, tmp_path: Path, caplog: pytest.LogCaptureFixture, module: str, why: str
) -> None:
    (tmp_path / f"{module}.py").write_text(PRELOADS[module])
    runtime = controller.LocalRuntime(
        harness.workdir, pythonpath=[HERE, tmp_path], preload_modules=[module]
    )
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            assert not await runtime.wait_fork_server_ready()
            await (await ctl.deploy("a", cfg(), harness.recorder())).wait()
            (replica,) = ctl.status("a").replicas
            assert replica.pid is not None
            assert parent_of(replica.pid) == os.getpid()
            await (await ctl.delete("a", force=True)).wait()
    (warning,) = [r for r in caplog.records if "fork server" in r.getMessage()]
    assert "fork server did not start" in warning.getMessage()
    assert why in (harness.workdir / "zygote.log").read_text()


async def test_preloaded_modules_are_imported_once_by_the_fork_server(
    harness: Harness, tmp_path: Path
) -> None:
    probe = tmp_path / "imported"
    (tmp_path / "probe.py").write_text(
        f"import os\nwith open({str(probe)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n"
    )
    runtime = controller.LocalRuntime(
        harness.workdir, pythonpath=[HERE, tmp_path], preload_modules=["probe"]
    )
    with trio.fail_after(LIMIT_S):
        async with controller.open_controller(runtime=runtime, store=harness.store) as ctl:
            assert await runtime.wait_fork_server_ready()
            await (await ctl.deploy("a", cfg(num_replicas=2), harness.recorder())).wait()
            assert probe.read_text() == f"{runtime.fork_server_pid}\n"
            await (await ctl.delete("a", force=True)).wait()


def test_preload_modules_need_the_fork_server(runtime_dir: Path) -> None:
    with pytest.raises(controller.ConfigError, match="preload_modules: needs the fork server"):
        controller.LocalRuntime(runtime_dir, preload_modules=["json"], fork_server=False)
    with pytest.raises(controller.ConfigError, match="preload_modules: must be a list"):
        controller.LocalRuntime(runtime_dir, preload_modules="json")


# Opens a runtime, forks one worker, prints both pids, and waits to be killed.
OWNER = """
import sys, trio, controller
async def main():
    rt = controller.LocalRuntime(sys.argv[1], pythonpath=[sys.argv[2]])
    async with trio.open_nursery() as nursery:
        await nursery.start(rt.serve, lambda tag, reason: None)
        assert await rt.wait_fork_server_ready()
        trivial = controller.ReplicaConfig("replicas:Trivial")
        spec = controller.ReplicaSpec("a#1", "a", "v1", trivial, None, {})
        info = await rt.start_replica(spec)
        print(rt.fork_server_pid, info.pid, flush=True)
        await trio.sleep_forever()
trio.run(main)
"""


async def test_the_fork_server_dies_with_the_controller_s_process_but_its_workers_do_not(
    runtime_dir: Path,
) -> None:
    workdir = runtime_dir / "w"
    with trio.fail_after(LIMIT_S):
        owner = await trio.lowlevel.open_process(
            [sys.executable, "-c", OWNER, str(workdir), str(HERE)], stdout=-1
        )
        assert owner.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            chunk = await owner.stdout.receive_some()
            assert chunk, "the owner exited early"
            line += chunk
        zygote, worker = (int(word) for word in line.split())
        pidfd = os.pidfd_open(zygote)
        try:
            owner.kill()  # SIGKILL: no clean-up of any kind
            await owner.wait()
            await trio.lowlevel.wait_readable(pidfd)  # PR_SET_PDEATHSIG
        finally:
            os.close(pidfd)
            await owner.stdout.aclose()
        assert is_zombie_or_gone(worker) in ("S", "R")
        # A controller opened later adopts it.
        runtime = controller.LocalRuntime(workdir, pythonpath=[HERE])
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.serve, lambda tag, reason: None)
            assert await runtime.list_replicas() == ["a#1"]
            info = await runtime.adopt_replica("a#1")
            assert info.pid == worker
            await runtime.kill_replica("a#1")
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("check", controller.testing.CONFORMANCE_CHECKS, ids=lambda c: c.__name__)
async def test_forked_workers_conform(
    harness: Harness, check: Callable[[controller.testing.Subject], Awaitable[None]]
) -> None:
    async def crash(runtime: controller.Runtime, tag: str) -> None:
        os.kill(forked_pid(harness.workdir, tag), signal.SIGKILL)
        await trio.lowlevel.checkpoint()

    subject = controller.testing.Subject(
        runtime=lambda: WaitsForTheForkServer(harness.local()),
        store=harness.store,
        replica=harness.recorder(),
        ignores_drain=harness.recorder(drain_s=600),
        crash=crash,
    )
    with trio.fail_after(LIMIT_S):
        await check(subject)
