"""Standby daemons on one host, as a user runs them: daemons sharing one SQLite store and one
worker dir (``--shared-dir``), real workers, a standalone ingress in front. The leader killed
(-9) under traffic, or paused past its lease and woken after another took over; a clean stop;
a standby's read-only view and its redirect of changes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from ..daemons import (
    LIMIT_S,
    Daemon,
    app,
    deploy,
    dirs,
    free_port,
    killed_at_exit,
    one_line,
    role,
    settled,
    shown,
    standalone,
    until,
)
from ..http_client import Traffic, request

#: The documented failover on one host: the lease (2 s) and one read of it (0.5 s) past the
#: leader's last renewal, then the recovery. Measured by bench/failover_bench.py; a test only
#: bounds it (`FAILOVER_BOUND_S`), with a busy machine's margin.
FAILOVER_S = 3.0
RENEW_S = 0.5
#: What a machine at load 20 adds to a bound of a few seconds: processes scheduled late.
BUSY_S = 10.0
FAILOVER_BOUND_S = FAILOVER_S + BUSY_S


async def start_all(
    nursery: trio.Nursery, root: Path, names: str, *extra: str
) -> tuple[Path, list[Daemon]]:
    """Daemons named by the letters of `names`, each with its own state dir, sharing one; the
    first leads (it is started first and waits for nothing)."""
    shared, *own = dirs(root, "shared", *names)
    daemons = [Daemon(path) for path in own]
    for daemon in daemons:
        await daemon.start(nursery, "--shared-dir", str(shared), "--no-ingress", *extra)
        assert daemon.process is not None
        assert daemon.process.returncode is None, daemon.log.decode()
    return shared, daemons


async def paused_between_writes(daemon: Daemon, store: Path) -> None:
    """SIGSTOP `daemon`, not inside a write transaction of the SQLite store: a leader paused
    there holds the file's write lock, and no standby can write until it wakes or dies (a
    limit the README states). The test holds the write lock itself while it sends the signal,
    so the daemon is between writes, or waiting for the lock (holding none)."""

    def hold_and_stop() -> None:
        conn = sqlite3.connect(store, isolation_level=None, timeout=30)
        try:
            conn.execute("BEGIN IMMEDIATE")
            assert daemon.process is not None
            daemon.process.send_signal(signal.SIGSTOP)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    await trio.to_thread.run_sync(hold_and_stop)


async def logged_within(daemon: Daemon, text: bytes, seconds: float) -> None:
    """`daemon.logged`, failing with the daemon's log if it takes longer than `seconds`."""
    with trio.move_on_after(seconds):
        await daemon.logged(text)
        return
    raise AssertionError(f"not logged within {seconds:g}s: {text!r}\n{daemon.log.decode()}")


async def role_at(daemon: Daemon, epoch: int) -> dict[str, Any]:
    """The daemon's leadership once it has seen `epoch` (a standby reads the lease every renew
    period): waited for on its watch's long poll, not by sleeping."""
    while (found := await role(daemon))["epoch"] < epoch:
        code, data = await daemon.http("GET", "/api/v1/watch?since=0&timeout_s=0.2&epoch=x")
        assert code == 200, data
        code, data = await daemon.http(
            "GET", f"/api/v1/watch?since={data['cursor']}&timeout_s=0.2&epoch={data['epoch']}"
        )
        assert code == 200, data
    return found


async def stopped(leader: Daemon, *standbys: Daemon) -> None:
    """The leader exits after its shutdown; the standbys are stopped (SIGTERM); all waited for."""
    for daemon in (leader, *standbys):
        assert daemon.process is not None
        if daemon is not leader:
            daemon.process.send_signal(signal.SIGTERM)
        assert await daemon.process.wait() == 0, daemon.log.decode()


def tags(status: dict[str, Any]) -> list[str]:
    return sorted(r["tag"] for r in status["replicas"])


def pids(status: dict[str, Any]) -> list[int]:
    return sorted(r["pid"] for r in status["replicas"])


async def test_kill_9_of_the_leader_under_traffic_fails_no_request(state_dir: Path) -> None:
    port = free_port()
    with trio.fail_after(LIMIT_S * 3):
        async with trio.open_nursery() as nursery:
            _, daemons = await start_all(nursery, state_dir, "abc")
            a, b, c = daemons
            with killed_at_exit(a, b, c):
                assert (await role(a))["role"] == "leader"
                assert [(await role(d))["role"] for d in (b, c)] == ["standby", "standby"]
                await deploy(a, "app", num_replicas=3)
                before = await until(a, "app", settled("v1"))
                # The ingress follows the leader, and the standbys when it cannot reach it.
                ingress = await standalone(
                    nursery, a, port, "--also-url", b.url, "--also-url", c.url
                )
                traffic = Traffic(port)
                async with trio.open_nursery() as senders:
                    for _ in range(4):
                        senders.start_soon(traffic.send)
                    await traffic.answered(40)
                    assert a.process is not None
                    killed_at = trio.current_time()
                    a.process.send_signal(signal.SIGKILL)
                    await a.process.wait()
                    # One of the two standbys leads (each logs it when it does).
                    async with trio.open_nursery() as first:
                        for standby in (b, c):

                            async def wait(d: Daemon = standby) -> None:
                                await d.logged(b"leading as epoch 2")
                                first.cancel_scope.cancel()

                            first.start_soon(wait)
                    took = trio.current_time() - killed_at
                    leader, other = (b, c) if b"leading as epoch 2" in b.log else (c, b)
                    status = await until(leader, "app", settled("v1"))
                    await traffic.answered(len(traffic.answers) + 40)
                    traffic.stop.set()
                answers = traffic.answers
                assert took <= FAILOVER_BOUND_S, f"failover took {took:.2f}s"
                assert [(code, b) for code, b in answers if code != 200] == []
                assert pids(status) == pids(before)  # adopted, none restarted
                assert (await role(leader))["role"] == "leader"
                seen = await role_at(other, 2)
                assert (seen["role"], seen["epoch"], seen["address"]) == (
                    "standby",
                    2,
                    leader.url,
                )
                assert b"leading" not in other.log
                # The new leader acts: it replaces a replica that dies.
                victim = status["replicas"][0]["pid"]
                os.kill(victim, signal.SIGKILL)
                after = await until(
                    leader,
                    "app",
                    lambda s: settled("v1")(s) and victim not in pids(s) and len(pids(s)) == 3,
                )
                assert len(set(pids(after)) & set(pids(status))) == 2
                ingress.process.send_signal(signal.SIGTERM)
                await ingress.process.wait()
                result = await leader.cli("shutdown")
                assert result.returncode == 0, result.stderr
                await stopped(leader, other)


async def test_a_leader_paused_past_its_lease_wakes_fenced_and_stands_by(
    state_dir: Path,
) -> None:
    with trio.fail_after(LIMIT_S * 3):
        async with trio.open_nursery() as nursery:
            shared, (a, b) = await start_all(nursery, state_dir, "ab")
            with killed_at_exit(a, b):
                await deploy(a, "app", num_replicas=2, user_config={"greeting": "one"})
                await until(a, "app", settled("v1"))
                assert a.process is not None
                await paused_between_writes(a, shared / "controller.db")
                await logged_within(b, b"leading as epoch 2", FAILOVER_S * 3)
                # The new leader changes the backend while the old one sleeps.
                await deploy(b, "app", num_replicas=3, user_config={"greeting": "two"})
                wanted = await until(
                    b, "app", lambda s: settled("v1")(s) and len(s["replicas"]) == 3
                )
                _, spec_before = await b.http("GET", "/api/v1/backends/app")
                a.process.send_signal(signal.SIGCONT)
                woke_at = trio.current_time()
                # At once, a change through the old leader's API: it must not land, whether
                # the old one still thinks it leads (its write is fenced at the store) or
                # already stands by (then the change goes to the new leader: 307).
                body = json.dumps(app(num_replicas=1, user_config={"greeting": "stale"}))
                code, data = await a.http("PUT", "/api/v1/backends/app", body.encode())
                assert code in (307, 503), (code, data)
                await a.logged(b"stopped leading (epoch 1)")
                assert trio.current_time() - woke_at <= RENEW_S + BUSY_S
                assert (await role(a))["role"] == "standby"
                # Nothing of the old epoch took effect: the store and the replicas are as the
                # new leader made them.
                status = await until(b, "app", settled("v1"))
                assert pids(status) == pids(wanted)
                assert status["generation"] == wanted["generation"]
                assert status["config"]["user_config"] == {"greeting": "two"}
                assert all(r["state"] == "RUNNING" for r in status["replicas"])
                _, spec_after = await b.http("GET", "/api/v1/backends/app")
                assert spec_after["generation"] == spec_before["generation"]
                assert b"stale" not in json.dumps(spec_after).encode()
                # The old one's view, read from the store, agrees (once it has read it).
                await shown(a, "app", lambda s: tags(s) == tags(wanted))
                assert (await role(a))["address"] == b.url
                result = await b.cli("shutdown")
                assert result.returncode == 0, result.stderr
                await stopped(b, a)


async def test_a_standby_reads_the_store_and_sends_changes_to_the_leader(
    state_dir: Path,
) -> None:
    with trio.fail_after(LIMIT_S * 3):
        async with trio.open_nursery() as nursery:
            _, (a, b) = await start_all(nursery, state_dir, "ab")
            with killed_at_exit(a, b):
                # Both take the shared dir's token: a client of either is a client of both.
                assert a.token == b.token
                file = state_dir / "app.toml"
                file.write_text(
                    "[backends.app]\n"
                    + "".join(f"{k} = {json.dumps(v)}\n" for k, v in app(num_replicas=2).items())
                )
                # The CLI pointed at the standby: the change goes to the leader.
                result = await b.cli("apply", "-f", str(file), "--wait")
                assert result.returncode == 0, result.stderr
                leader_status = await until(a, "app", settled("v1"))
                # The standby shows the store as the leader wrote it.
                standby_status = await shown(b, "app", settled("v1"))
                assert tags(standby_status) == tags(leader_status)
                printed = await b.cli("status")
                out = printed.stdout.decode()
                assert "app" in out
                assert "leader: another daemon, " in out
                assert "this daemon stands by" in out
                # A raw write to the standby is sent on, naming the leader.
                code, data, headers = await b.http_with_headers(
                    "DELETE", "/api/v1/backends/app?force=false"
                )
                assert code == 307, data
                assert headers["location"] == f"{a.url}/api/v1/backends/app?force=false"
                assert data["error"]["leader"] == a.url
                # Its watch serves the replicas that serve.
                code, watch = await b.http("GET", "/api/v1/watch?since=0&timeout_s=0")
                assert code == 200, watch
                [snapshot] = watch["snapshots"]
                assert len(snapshot["replicas"]) == 2
                # A clean stop of the leader hands over at once: the lease is released, not
                # left to lapse (said in the log; a bound in seconds failed beside a CPU hog).
                assert a.process is not None
                a.process.send_signal(signal.SIGINT)
                assert await a.process.wait() == 0
                await b.logged(b"leading as epoch 2")
                assert b"was released" in b.log
                status = await until(b, "app", settled("v1"))
                assert pids(status) == pids(leader_status)
                result = await b.cli("shutdown")
                assert result.returncode == 0, result.stderr
                await stopped(b)


async def test_a_standby_leaves_its_config_alone_and_its_ingress_reports_to_the_leader(
    state_dir: Path,
) -> None:
    shared, own_a, own_b = dirs(state_dir, "shared", "a", "b")
    a, b = Daemon(own_a), Daemon(own_b)
    # A backend that scales from zero: only the load an ingress reports brings a replica.
    zero = app(
        num_replicas=1,
        route_prefix="/zero",
        autoscaling={"min_replicas": 0, "max_replicas": 2, "scale_to_zero_delay_s": 60},
    )
    stale = state_dir / "stale.toml"
    stale.write_text(
        "[backends.zero]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in app(num_replicas=3).items())
    )
    port = free_port()
    with trio.fail_after(LIMIT_S * 3), killed_at_exit(a, b):
        async with trio.open_nursery() as nursery:
            await a.start(nursery, "--shared-dir", str(shared), "--no-ingress")
            code, data = await a.http("PUT", "/api/v1/backends/zero", json.dumps(zero).encode())
            assert code == 200, data
            generation = data["generation"]
            # A standby started with an old file: applied at a takeover, it would undo the
            # leader's changes.
            await b.start(
                nursery,
                "--shared-dir",
                str(shared),
                "--config",
                str(stale),
                "--ingress-listen",
                f"127.0.0.1:{port}",
            )
            await b.logged(b"not applied: this daemon starts as a standby")
            # Through the standby's own ingress, a request to a backend at zero: the standby
            # sends the load on, the leader starts a replica, the standby's view routes to it.
            answer = await request(port, "/zero/x")
            assert answer.status == 200, answer.body
            leader_status = await until(a, "zero", lambda s: len(s["replicas"]) >= 1)
            assert a.process is not None
            a.process.send_signal(signal.SIGKILL)
            await a.process.wait()
            await b.logged(b"leading as epoch 2")
            status = await until(b, "zero", lambda s: s["goal_done"])
            assert status["generation"] == generation  # nothing of the stale file
            assert tags(status) == tags(leader_status)
            result = await b.cli("shutdown")
            assert result.returncode == 0, result.stderr
            await stopped(b)


async def test_a_daemon_with_another_token_than_its_shared_dir_is_refused(
    state_dir: Path,
) -> None:
    shared, own_a, own_b = dirs(state_dir, "shared", "a", "b")
    a = Daemon(own_a)
    with trio.fail_after(LIMIT_S), killed_at_exit(a):
        async with trio.open_nursery() as nursery:
            await a.start(nursery, "--shared-dir", str(shared), "--no-ingress")
            result = await trio.run_process(
                [
                    *Daemon(own_b).cli_argv(),
                    *("run", "--listen", "127.0.0.1:0", "--shared-dir", str(shared)),
                    "--no-ingress",
                ],
                capture_stderr=True,
                check=False,
                env={**os.environ, "CONTROLLER_TOKEN": "another-token-0123456789"},
            )
            assert result.returncode == 1
            line = one_line(result.stderr)
            assert "$CONTROLLER_TOKEN is not the token of the shared dir" in line
            assert (await role(a))["role"] == "leader"
            await stopped_by_signal(a)


async def stopped_by_signal(daemon: Daemon) -> None:
    assert daemon.process is not None
    daemon.process.send_signal(signal.SIGTERM)
    assert await daemon.process.wait() == 0


async def test_apply_wait_through_a_standby_outlasts_the_leader_s_death(state_dir: Path) -> None:
    """`apply --wait` follows its change at the leader; killed mid-rollout, the wait goes on at
    whoever leads next, and says done only once that one has finished it."""
    slow = {"entrypoint": "replicas:SlowInit", "max_surge": 1, "max_unavailable": 0}
    first, second = state_dir / "v1.toml", state_dir / "v2.toml"
    for file, version in ((first, "v1"), (second, "v2")):
        fields = {**slow, "num_replicas": 3, "version": version, "init_args": [0.6]}
        file.write_text(
            "[backends.slow]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items())
        )
    with trio.fail_after(LIMIT_S * 3):
        async with trio.open_nursery() as nursery:
            _, (a, b) = await start_all(nursery, state_dir, "ab")
            with killed_at_exit(a, b):
                result = await b.cli("apply", "-f", str(first), "--wait")
                assert result.returncode == 0, result.stderr
                waited: list[subprocess.CompletedProcess[bytes]] = []
                async with trio.open_nursery() as cli:

                    async def apply_and_wait() -> None:
                        waited.append(await b.cli("apply", "-f", str(second), "--wait"))

                    cli.start_soon(apply_and_wait)
                    # Mid-rollout (a new replica up, the rest on their way): the leader dies.
                    await until(
                        a, "slow", lambda s: s["ready_of_version"] >= 1 and not s["goal_done"]
                    )
                    assert a.process is not None
                    a.process.send_signal(signal.SIGKILL)
                    await a.process.wait()
                [done] = waited
                assert done.returncode == 0, (done.stdout, done.stderr)
                assert done.stdout.decode().rstrip().endswith("done")
                # It said done once the new leader had finished: the rollout is whole.
                assert b"goal of generation 2 reached" in b.log
                status = (await b.status())["slow"]
                assert status["goal_done"]
                assert {r["version"] for r in status["replicas"]} == {"v2"}
                assert len(status["replicas"]) == 3
                result = await b.cli("shutdown")
                assert result.returncode == 0, result.stderr
                await stopped(b)


def _chattr(flag: str, path: Path) -> bool:
    """Set or clear an attribute of `path` (root on ext4 and the like); whether it could."""
    result = subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False)
    return result.returncode == 0


async def test_an_immutable_shm_stops_no_daemon_and_they_lead_again_once_it_is_mended(
    state_dir: Path,
) -> None:
    """The fourth attack made the shared store's ``-shm`` immutable: SQLite's next write to
    its mapped pages faulted, and both daemons died of SIGBUS within 2 s. Now each refuses the
    store by name (the file, and `chattr -i`), no process dies, and once the file is mended
    a daemon leads and changes go through again."""
    with trio.fail_after(LIMIT_S * 4):
        async with trio.open_nursery() as nursery:
            shared, (a, b) = await start_all(nursery, state_dir, "ab")
            shm = shared / "controller.db-shm"
            with killed_at_exit(a, b):
                await deploy(a, "app", num_replicas=1)
                await until(a, "app", settled("v1"))
                if not _chattr("+i", shm):
                    pytest.skip("chattr +i needs root on a file system with attributes")
                try:
                    said = f"`chattr -i {shm}`".encode()
                    await a.logged(said)
                    await b.logged(said)
                    # The leader cannot renew its lease: it steps down when the lease ends,
                    # and the standby cannot take it (the file is theirs alike).
                    await a.logged(b"stopped leading (epoch 1)")
                    # Told, neither died: the fault was refused, not touched.
                    for daemon in (a, b):
                        assert daemon.process is not None
                        assert daemon.process.returncode is None, daemon.log[-3000:]
                finally:
                    _chattr("-i", shm)
                # Mended: a daemon leads, and a change lands.
                leader = await _first_to_log(b"leading as epoch 2", a, b)
                await deploy(leader, "app", num_replicas=2)
                await until(leader, "app", lambda s: settled("v1")(s) and len(s["replicas"]) == 2)
                assert (await leader.cli("shutdown")).returncode == 0
                await stopped(leader, b if leader is a else a)


async def _first_to_log(text: bytes, *daemons: Daemon) -> Daemon:
    """The first of `daemons` to log `text`."""
    first: list[Daemon] = []
    async with trio.open_nursery() as nursery:

        async def one(daemon: Daemon) -> None:
            await daemon.logged(text)
            first.append(daemon)
            nursery.cancel_scope.cancel()

        for daemon in daemons:
            nursery.start_soon(one, daemon)
    return first[0]
