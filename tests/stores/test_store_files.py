"""The daemon's SQLite files as an attacker, or a failing disk, leaves them: a ``-shm`` file cut
while the daemon runs, a fatal signal, a store in a place it cannot write. Real daemon
processes, real clock; every wait bounded by fail_after."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import trio
import trio.testing

import controller
from controller._leadership.keeper import Leadership
from controller._model.decisions.lease import Lease, LeaseTiming

from ..daemons import LIMIT_S, Daemon, ingress_args, killed_at_exit, one_line, running, trivial


async def test_a_daemon_alone_maps_no_shm_file_so_none_can_kill_it(state_dir: Path) -> None:
    shm = state_dir / "controller.db-shm"
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--no-ingress") as daemon:
            assert daemon.process is not None
            body = json.dumps(trivial(1)).encode()
            assert (await daemon.http("PUT", "/api/v1/backends/a", body))[0] == 200
            assert (await daemon.cli("wait", "a")).returncode == 0
            # Before: SQLite mapped this file, and a cut of it killed the daemon (SIGBUS) at
            # its next lease renewal, without a line in any log.
            mapped = shm.exists()
            shm.write_bytes(b"")
            os.chmod(shm, 0)
            for n in (2, 1):
                scaled = json.dumps(trivial(n)).encode()
                assert (await daemon.http("PUT", "/api/v1/backends/a", scaled))[0] == 200
                assert (await daemon.cli("wait", "a")).returncode == 0
            assert daemon.process.returncode is None
            assert not mapped
        assert b"ERROR" not in daemon.log, daemon.log.decode()


async def test_a_fatal_signal_leaves_a_traceback_in_the_log(state_dir: Path) -> None:
    daemon = Daemon(state_dir)
    with killed_at_exit(daemon), trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await daemon.start(nursery, "--no-ingress")
            assert daemon.process is not None
            # As a storage fault under a mapped file would: SIGBUS, which no Python code can
            # catch and survive. It is said, with where each thread was.
            daemon.process.send_signal(signal.SIGBUS)
            assert await daemon.process.wait() == -signal.SIGBUS
    logged = (state_dir / "daemon.log").read_text()
    assert "Fatal Python error: Bus error" in logged, logged
    assert "Current thread" in logged or "Thread 0x" in logged, logged


def _read_only(paths: list[Path]) -> list[str]:
    """What to put before a command so that it finds `paths` read-only: for a user, their
    modes; root writes whatever the modes say, so for root a read-only bind mount of each, in
    a mount namespace of the command's own (gone with it)."""
    if os.geteuid() != 0:
        for path in paths:
            os.chmod(path, 0o500 if path.is_dir() else 0o400)
        return []
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, check=False
    )
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip("root, and no mount namespace to make a file read-only for root in")
    mounts = 'while [ "$1" != -- ]; do mount --bind -o ro "$1" "$1" || exit 97; shift; done'
    return [
        *("unshare", "--mount", "--propagation", "private", "sh", "-c"),
        f'{mounts}; shift; exec "$@"',
        "sh",
        *map(str, paths),
        "--",
    ]


@pytest.mark.parametrize(
    ("shared", "unwritable", "expected"),
    [
        # The store's own files, which SQLite's messages never name.
        (False, "controller.db-wal", "{file} cannot be written"),
        (True, "controller.db-shm", "{file} cannot be written"),
        (True, "", "cannot be written"),
        # The state dir itself: its lock file is the first thing written.
        (False, "", "cannot write {dir}/lock"),
    ],
)
async def test_a_store_it_cannot_write_is_refused_at_start_naming_the_file(
    state_dir: Path, tmp_path: Path, shared: bool, unwritable: str, expected: str
) -> None:
    store_dir = tmp_path / "shared" if shared else state_dir
    store_dir.mkdir(mode=0o700, exist_ok=True)
    for name in ("controller.db", "controller.db-wal", "controller.db-shm"):
        (store_dir / name).write_bytes(b"")
        os.chmod(store_dir / name, 0o600)
    target = store_dir / unwritable
    wrap = _read_only([target])
    args = ["--listen", "127.0.0.1:0", "--no-ingress"]
    if shared:
        args += ["--shared-dir", str(store_dir)]
    with trio.fail_after(LIMIT_S):
        result = await trio.run_process(
            [*wrap, *Daemon(state_dir).cli_argv(), "run", *ingress_args(args), *args],
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 1, result.stderr.decode()
    line = one_line(result.stderr)
    assert expected.format(file=target, dir=store_dir) in line, line


async def test_a_store_that_fails_later_is_logged_and_the_daemon_stays(state_dir: Path) -> None:
    daemon = Daemon(state_dir)
    with killed_at_exit(daemon), trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await daemon.start(nursery, "--no-ingress")
            assert daemon.process is not None
            # The log replaced under the daemon: SQLite would go on writing the deleted one.
            wal = state_dir / "controller.db-wal"
            copy = state_dir / "wal.copy"
            copy.write_bytes(wal.read_bytes())
            copy.replace(wal)
            await daemon.logged(b"stopped leading (epoch 1); standing by")
            assert daemon.process.returncode is None
            code, data = await daemon.http("GET", "/api/v1/backends")
            assert (code, data["leadership"]["role"]) == (200, "standby"), data
            assert await daemon.stop(signal.SIGTERM) == 0
    log = daemon.log.decode()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1, log
    assert f"renewing the lease of {state_dir}/controller.db" in errors[0]
    assert "deleted or replaced while in use; nothing was written" in errors[0]


async def test_a_store_that_reads_but_cannot_write_is_logged_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk: the lease reads, no claim goes through. One line says so, not two a
    period ("failed", "answers again")."""
    store = controller.MemoryStore()
    caplog.set_level(logging.INFO, logger="controller")

    class Full:
        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        async def claim_lease(self, seen: Lease | None, new: Lease) -> bool:
            raise controller.StoreError("writing: database or disk is full")

    leadership = Leadership(Full(), "host:/a", LeaseTiming(duration_s=2.0, renew_s=0.5))  # type: ignore[arg-type]
    with trio.move_on_after(10):
        await leadership.campaign()
    assert [r.getMessage() for r in caplog.records] == [
        "claiming the lease: writing: database or disk is full; trying again every 0.5s"
    ]


async def test_an_unexpected_error_that_stops_the_daemon_is_in_its_log(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by an attack: a daemon that died of a fault said so on stderr only; daemon.log,
    # which a service manager's user reads, just stopped.
    from controller._daemon import main

    async def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a fault of ours")

    monkeypatch.setattr(main, "serve", broken)
    options = main.DaemonOptions(state_dir, listen="127.0.0.1:0", ingress_listen=None)
    with pytest.raises(RuntimeError, match="a fault of ours"):
        await main.run_daemon(options)
    log = (state_dir / "daemon.log").read_text()
    assert "CRITICAL" in log
    assert "the daemon stops on an unexpected error" in log
    assert "RuntimeError: a fault of ours" in log
