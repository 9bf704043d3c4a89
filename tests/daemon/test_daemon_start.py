"""The daemon's start and stop as a new user, then an attacker, will meet them: Ctrl-C and start
again on the same port, two daemons on one state dir, a start that cannot bind, requests no machine
can run, planted symlinks and unsafe state dirs, a store that is not one. Real daemon processes,
real worker processes, real clock; every wait bounded by fail_after."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
from functools import partial
from pathlib import Path

import pytest
import trio

from controller import BackendConfig, ReplicaConfig, SQLiteStore
from controller._model.records.checkpoint import dump
from controller._model.records.records import SpecRecord, spec_key

from ..daemons import (
    LIMIT_S,
    Daemon,
    converged_daemon,
    free_port,
    ingress_args,
    manifest,
    one_line,
    running,
    trivial,
)
from ..workers import worker_pids


def fd_targets(pid: int) -> list[str]:
    """What each open descriptor of `pid` is: a path, or ``socket:[inode]``, ``pipe:[...]``."""
    out = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except FileNotFoundError:
            continue
    return out


def sockets_of(pid: int) -> set[str]:
    return {t for t in fd_targets(pid) if t.startswith("socket:")}


def _free_listen(args: tuple[str, ...]) -> list[str]:
    """No fixed port unless the test names one: the README's daemon may hold 7070."""
    return [] if "--listen" in args else ["--listen", "127.0.0.1:0"]


async def failed_start(state_dir: Path, *args: str) -> str:
    """Run `controller run` that must fail at once; its one line."""
    with trio.fail_after(LIMIT_S):
        result = await trio.run_process(
            [*Daemon(state_dir).cli_argv(), "run", *_free_listen(args), *ingress_args(args), *args],
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1, result.stderr.decode()
    return one_line(result.stderr)


async def test_ctrl_c_then_run_again_on_the_same_port(state_dir: Path) -> None:
    """The README's restart story: the second start takes the same port, adopts the same
    workers, and clients of the stopped daemon were refused, not left hanging."""
    port = free_port()
    listen = f"127.0.0.1:{port}"
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = await converged_daemon(nursery, state_dir, 2, listen)
            pids = worker_pids(state_dir)
            assert first.process is not None
            # Each worker holds what was meant for it and nothing of the daemon's: no socket of
            # its (the API's port among them), no file of the state dir but the worker's log.
            daemon_sockets = sockets_of(first.process.pid)
            for pid in pids:
                assert not sockets_of(pid) & daemon_sockets
                mine = [t for t in fd_targets(pid) if t.startswith(str(state_dir))]
                assert all(re.fullmatch(r".*/w/logs/a#[0-9a-f]{12}\.log", t) for t in mine), mine
            token = first.token
            assert await first.stop(signal.SIGINT) == 0
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()

        async with running(state_dir, listen=listen) as second:
            assert second.url == f"http://{listen}"
            assert second.token == token  # a router given the token carries on
            assert await second.http("GET", "/healthz", token=None) == (200, {"ok": True})
            assert (await second.cli("wait", "a")).returncode == 0
            assert worker_pids(state_dir) == pids  # adopted, not restarted


async def test_run_right_after_sigterm_waits_for_the_stopping_daemon(state_dir: Path) -> None:
    """`kill -TERM $PID; controller run`, as a supervisor does: the new start waits for the old
    daemon to exit (it says in the lock file that it is stopping), then adopts its workers."""
    listen = f"127.0.0.1:{free_port()}"
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = await converged_daemon(nursery, state_dir, 1, listen)
            pids = worker_pids(state_dir)
            assert first.process is not None
            first.process.send_signal(signal.SIGTERM)
            await first.logged(b"SIGTERM: stopping")  # logged once the lock file says so
            # Held on its way out, so that the new start surely finds it still there.
            first.process.send_signal(signal.SIGSTOP)
            second = Daemon(state_dir)
            nursery.start_soon(partial(second.start, nursery, listen=listen))
            await second.logged(b"waiting for the daemon that is stopping")
            first.process.send_signal(signal.SIGCONT)
            assert await first.process.wait() == 0
            await second.logged(b"listening on")
            assert second.url == f"http://{listen}"
            assert (await second.cli("wait", "a")).returncode == 0
            assert worker_pids(state_dir) == pids  # adopted, not restarted
            result = await second.cli("shutdown")
            assert result.returncode == 0, result.stderr
            assert second.process is not None
            assert await second.process.wait() == 0


async def test_a_second_daemon_on_the_same_state_dir_is_refused(state_dir: Path) -> None:
    file = state_dir / "backends.toml"
    file.write_text(manifest(a=trivial(1)))
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir, "--config", str(file)) as first:
            assert (await first.cli("wait", "a")).returncode == 0
            token, address = first.token, (state_dir / "daemon.json").read_text()
            pids = worker_pids(state_dir)
            line = await failed_start(state_dir, "--listen", "127.0.0.1:0")
            assert first.process is not None
            assert f"pid {first.process.pid}" in line
            assert first.url in line
            assert "--state-dir" in line
            # The first daemon lost nothing: its token, its address, its replicas.
            assert (first.token, (state_dir / "daemon.json").read_text()) == (token, address)
            assert (await first.status())["a"]["state"] == "HEALTHY"
            assert worker_pids(state_dir) == pids
            # The lock is the directory's own: deleting a file in it does not undo it.
            os.unlink(state_dir / "lock")
            line = await failed_start(state_dir, "--listen", "127.0.0.1:0")
            assert "another controller daemon" in line
            assert (await first.status())["a"]["state"] == "HEALTHY"


async def test_a_start_that_cannot_bind_leaves_every_replica_as_it_was(state_dir: Path) -> None:
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = await converged_daemon(nursery, state_dir, 3)
            pids = worker_pids(state_dir)
            assert await first.stop(signal.SIGTERM) == 0
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", 0))
            squatter.listen()
            port = squatter.getsockname()[1]
            line = await failed_start(state_dir, "--listen", f"127.0.0.1:{port}")
        assert f"cannot listen on 127.0.0.1:{port}" in line
        assert "--listen" in line
        assert worker_pids(state_dir) == pids  # untouched: not adopted, not killed
        async with running(state_dir) as second:
            assert (await second.cli("wait", "a")).returncode == 0
            assert worker_pids(state_dir) == pids


async def test_counts_no_machine_can_run_are_refused_at_once(state_dir: Path) -> None:
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            for body in (
                {"entrypoint": "replicas:Trivial", "num_replicas": 1_000_000},
                {"entrypoint": "replicas:Trivial", "num_replicas": 10**6, "resources": {"CPU": 0}},
            ):
                with trio.fail_after(5):
                    code, error = await daemon.http(
                        "PUT", "/api/v1/backends/big", json.dumps(body).encode()
                    )
                assert code == 409, error
                message = error["error"]["message"]
                assert "replica_slots" in message, message
                assert "Nothing was applied" in message
            # Past any runtime's reach, the count is refused by the model itself, naming the rule.
            body = {"entrypoint": "replicas:Trivial", "num_replicas": 10**18}
            code, error = await daemon.http(
                "PUT", "/api/v1/backends/big", json.dumps(body).encode()
            )
            assert code == 422, error
            assert "num_replicas: must be a whole number from 0 to 1000000" in str(error)
            assert await daemon.http("GET", "/healthz", token=None) == (200, {"ok": True})
            assert await daemon.status() == {}
            assert worker_pids(state_dir) == {}


async def test_a_stored_spec_that_can_never_run_does_not_wedge_the_start(state_dir: Path) -> None:
    # As an older controller, which counted no slots, would have stored it.
    with SQLiteStore(state_dir / "controller.db") as store:
        record = SpecRecord(
            "big",
            1,
            BackendConfig(num_replicas=1_000_000, version="v1"),
            ReplicaConfig("replicas:Trivial"),
        )
        await store.write({spec_key("big"): dump(record)})
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--max-replicas", "4") as daemon:
            assert await daemon.http("GET", "/healthz", token=None) == (200, {"ok": True})
            big = (await daemon.status())["big"]
            assert (big["state"], big["reason"]) == ("DEPLOY_FAILED", "Infeasible")
            assert "cannot be placed" in big["last_error"]
            assert "'replica_slots': 4.0" in big["last_error"]
            assert worker_pids(state_dir) == {}
            # A deploy that fits lifts it.
            body = json.dumps(trivial(2)).encode()
            assert (await daemon.http("PUT", "/api/v1/backends/big", body))[0] == 200
            assert (await daemon.cli("wait", "big")).returncode == 0
            assert len(worker_pids(state_dir)) == 2


async def test_state_files_are_private_and_never_written_through_a_symlink(
    state_dir: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "precious"
    victim.write_text("precious")
    # Files it only writes: the links are replaced. (One it reads first, the token, stops the
    # start: tests/daemon/test_state_files.py.)
    for name in ("daemon.json", "lock"):
        (state_dir / name).symlink_to(victim)
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            assert daemon.token
            for name in ("token", "daemon.json", "controller.db", "daemon.log", "lock"):
                info = os.lstat(state_dir / name)
                assert stat.S_ISREG(info.st_mode), name
                assert info.st_mode & 0o777 == 0o600, name
            assert (state_dir / "w").stat().st_mode & 0o777 == 0o700
    assert victim.read_text() == "precious"


async def test_an_unsafe_state_dir_is_refused_before_anything_is_written(state_dir: Path) -> None:
    os.chmod(state_dir, 0o777)
    line = await failed_start(state_dir, "--listen", "127.0.0.1:0")
    assert "may be written by other users" in line
    assert f"chmod go-w {state_dir}" in line
    assert os.listdir(state_dir) == []
    os.chmod(state_dir, 0o700)
    # A database planted as a symlink is refused, and its target untouched.
    os.symlink("/etc/hostname", state_dir / "controller.db")
    line = await failed_start(state_dir, "--listen", "127.0.0.1:0")
    assert "cannot use the store" in line


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a directory to another user")
async def test_a_state_dir_of_another_user_is_refused(state_dir: Path) -> None:
    os.chown(state_dir, 65534, 65534)
    line = await failed_start(state_dir, "--listen", "127.0.0.1:0")
    assert "owned by uid 65534" in line
    os.chown(state_dir, 0, 0)


@pytest.mark.parametrize(
    ("plant", "listen", "expected"),
    [
        ("daemon.log/", "127.0.0.1:0", "daemon.log: Is a directory"),
        ("w", "127.0.0.1:0", "w: File exists"),
        # Refused as it is read, before anything is touched (a link too: test_state_files.py).
        ("token/", "127.0.0.1:0", "token: is not a regular file (d"),
        ("", "127.0.0.1:99999", "a port is 0 to 65535"),
        ("", "192.0.2.1:0", "this machine has no such address"),
    ],
)
async def test_start_up_failures_are_one_line(
    state_dir: Path, plant: str, listen: str, expected: str
) -> None:
    if plant.endswith("/"):
        os.mkdir(state_dir / plant.rstrip("/"))
    elif plant:
        (state_dir / plant).write_text("in the way")
    line = await failed_start(state_dir, "--listen", listen)
    assert expected in line, line


async def test_the_cli_trusts_only_a_state_dir_of_its_own(state_dir: Path) -> None:
    cli = Daemon(state_dir)
    with trio.fail_after(LIMIT_S):
        result = await cli.cli("status")
        assert result.returncode == 1
        err = result.stderr.decode()
        assert f"no controller daemon is running for the state dir {state_dir}" in err
        if os.geteuid() == 0:
            # Another user's state dir may point the CLI, and the token, anywhere.
            (state_dir / "daemon.json").write_text('{"url": "http://127.0.0.1:9"}')
            os.chown(state_dir, 65534, 65534)
            try:
                result = await cli.cli("status")
            finally:
                os.chown(state_dir, 0, 0)
            assert result.returncode == 1
            assert "owned by uid 65534" in result.stderr.decode()


async def test_a_store_that_is_not_a_database_is_one_line(state_dir: Path) -> None:
    (state_dir / "controller.db").write_bytes(b"this is not a database" * 100)
    line = await failed_start(state_dir, "--listen", "127.0.0.1:0")
    assert "file is not a database" in line
    assert "no replica was touched" in line


async def test_an_emptied_store_beside_live_workers_stops_the_start_not_the_workers(
    state_dir: Path,
) -> None:
    with trio.fail_after(LIMIT_S * 3):
        async with trio.open_nursery() as nursery:
            first = await converged_daemon(nursery, state_dir, 2)
            pids = worker_pids(state_dir)
            assert await first.stop(signal.SIGTERM) == 0
        (state_dir / "controller.db").write_bytes(b"")  # emptied, as by `: > controller.db`
        line = await failed_start(state_dir, "--listen", "127.0.0.1:0")
        assert "the store names no backend, but 2 replicas of an earlier daemon still run" in line
        assert "--forget-replicas" in line
        assert worker_pids(state_dir) == pids
        # Told so, the user starts over: the workers nothing names are stopped.
        async with running(state_dir, "--forget-replicas") as daemon:
            assert await daemon.status() == {}
        assert worker_pids(state_dir) == {}  # the daemon has exited: its kills are done
