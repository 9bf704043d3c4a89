"""The ingress as a user meets it: the daemon's own (the README's main job), and standalone
processes that follow a daemon over HTTP, outlive its restart, and share one port."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import controller
from controller.ingress import HTTPSource

from ..daemons import (
    LIMIT_S,
    Daemon,
    Standalone,
    free_port,
    ingress_pids,
    manifest,
    one_line,
    running,
    standalone,
)
from ..http_client import THINK_S, request
from ..pristine import EXAMPLES


def app(n: int = 2, **extra: Any) -> dict[str, Any]:
    return {
        "entrypoint": "http_replica:HTTPReplica",
        "num_replicas": n,
        "version": "v1",
        "route_prefix": "/app",
        "graceful_shutdown_timeout_s": 5,
        **extra,
    }


def port_of(url: str) -> int:
    return int(url.rpartition(":")[2])


async def test_the_readme_main_job_routes_through_the_daemon_s_ingress(state_dir: Path) -> None:
    """`controller run --config examples/backends.toml`, then `curl 127.0.0.1:8000/hello` and
    `/echo` (on a free port here), through a restart on the same ports."""
    ingress_port = free_port()
    args = (
        *("--config", str(EXAMPLES / "backends.toml"), "--pythonpath", str(EXAMPLES)),
        *("--ingress-listen", f"127.0.0.1:{ingress_port}"),
    )
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery, *args)
            for name in ("hello", "echo", "greeter"):
                assert (await first.cli("wait", name)).returncode == 0
            hello = await request(ingress_port, "/hello?name=you")
            assert (hello.status, hello.body) == (200, b"hello, you\n")
            echo = await request(ingress_port, "/echo")
            assert echo.status == 200
            assert echo.json()["greeting"] == "hello"
            assert (await request(ingress_port, "/greeter/hi")).json()["greeting"] == "good day"
            code, metrics = await first.http("GET", "/metrics")
            assert code == 200
            assert 'ingress_requests_total{backend="echo",code="200",route="/echo"} 1.0' in metrics
            pids = {r["pid"] for r in (await first.status())["echo"]["replicas"]}
            api = first.url.removeprefix("http://")
            assert await first.stop(signal.SIGINT) == 0
            # Started again at once, on the same ports: the same replicas answer.
            second = Daemon(state_dir)
            await second.start(nursery, *args, listen=api)
            assert (await second.cli("wait", "echo")).returncode == 0
            again = await request(ingress_port, "/echo")
            assert again.json()["pid"] in pids
            assert (await second.cli("shutdown")).returncode == 0
            assert second.process is not None
            assert await second.process.wait() == 0


@asynccontextmanager
async def standalone_ingress(daemon: Daemon, port: int, *extra: str) -> AsyncIterator[Standalone]:
    """`controller ingress`, stopped (SIGTERM, which stops its --workers too) however the test
    ends."""
    async with trio.open_nursery() as nursery:
        ingress = await standalone(nursery, daemon, port, *extra)
        try:
            yield ingress
        finally:
            if ingress.process.returncode is None:
                ingress.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(10, shield=True):
                await ingress.process.wait()


async def test_a_standalone_ingress_follows_the_daemon_and_outlives_its_restart(
    state_dir: Path,
) -> None:
    file = state_dir / "app.toml"
    file.write_text(manifest(app=app(2)))
    port = free_port()
    with trio.fail_after(LIMIT_S * 3):
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            daemon = Daemon(state_dir)
            await daemon.start(nursery, "--config", str(file), "--no-ingress")
            assert (await daemon.cli("wait", "app")).returncode == 0
            ingress = await stack.enter_async_context(
                standalone_ingress(daemon, port, "--workers", "2")
            )
            await ingress.logged(b"serving on", times=2)
            first = await request(port, "/app/x")
            assert first.status == 200
            assert first.json()["replica"].startswith("app#")
            # Two processes serve the port: new connections reach both.
            pids = {(await request(port, "/-/healthz")).json()["pid"] for _ in range(40)}
            assert len(pids) == 2
            # The daemon goes away: the ingress routes on what it last heard.
            api = daemon.url.removeprefix("http://")
            assert await daemon.stop(signal.SIGTERM) == 0
            await ingress.logged(b"is unreachable")
            assert (await request(port, "/app")).status == 200
            # It comes back (a new epoch): the ingress follows it again, and still routes.
            again = Daemon(state_dir)
            await again.start(nursery, "--no-ingress", listen=api)
            await ingress.logged(b"following the daemon")
            assert (await request(port, "/app")).status == 200
            # Deleting the backend takes its route away.
            assert (await again.cli("delete", "app", "--wait")).returncode == 0
            await ingress.logged(b"route /app removed")
            assert (await request(port, "/app")).status == 404
            ingress.process.send_signal(signal.SIGTERM)
            assert await ingress.process.wait() == 0
            assert (await again.cli("shutdown")).returncode == 0
            assert again.process is not None
            assert await again.process.wait() == 0


async def test_load_reports_over_the_api_show_in_status_and_metrics(state_dir: Path) -> None:
    file = state_dir / "app.toml"
    file.write_text(manifest(app=app(1)))
    with trio.fail_after(LIMIT_S):
        async with running(state_dir, "--config", str(file)) as daemon:
            assert (await daemon.cli("wait", "app")).returncode == 0
            tag = (await daemon.status())["app"]["replicas"][0]["tag"]
            source = HTTPSource(daemon.url, daemon.token)
            await source.report(
                [
                    controller.LoadReport("ingress-a", "app", {tag: 3}, queued=2),
                    controller.LoadReport("ingress-a", "nope", {}, queued=1),
                ]
            )
            await source.report([controller.LoadReport("ingress-b", "app", {tag: 1})])
            load = (await daemon.status())["app"]["load"]
            # The third source is the daemon's own ingress: its zero is a signal too.
            assert load == {
                "in_flight": 4,
                "queued": 2,
                "replicas": {tag: 4},
                "sources": 3,
                "self_reported": 0,
                "served": {},  # its replicas serve their own port: they count nothing
                "models": {},  # nor hold models
                "batches": {},  # nor batch
            }
            code, metrics = await daemon.http("GET", "/metrics")
            assert 'controller_backend_requests_in_flight{backend="app"} 4.0' in metrics
            assert 'controller_backend_requests_queued{backend="app"} 2.0' in metrics
            body = json.dumps({"source": "x", "backends": {"app": {"in_flight": {}, "queued": -1}}})
            code, answer = await daemon.http("POST", "/api/v1/load", body.encode())
            assert code == 422
            assert "queued" in answer["error"]["message"]
            assert (await daemon.status())["app"]["load"]["sources"] == 3  # nothing taken


async def test_a_route_leads_to_one_backend(state_dir: Path) -> None:
    with trio.fail_after(LIMIT_S):
        async with running(state_dir) as daemon:
            a = json.dumps({**app(0)}).encode()
            assert (await daemon.http("PUT", "/api/v1/backends/a", a))[0] == 200
            code, answer = await daemon.http("PUT", "/api/v1/backends/b", a)
            assert code == 409
            assert answer["error"]["type"] == "RouteConflict"
            assert "'a'" in answer["error"]["message"]
            # In one file, both are named: refused before anything is applied.
            file = daemon.state_dir / "two.toml"
            file.write_text(manifest(c=app(0, route_prefix="/c"), d=app(0, route_prefix="/c")))
            result = await daemon.cli("apply", "-f", str(file))
            assert result.returncode == 2
            assert b"route_prefix: '/c' is backend 'c'" in result.stderr
            # Over the API each backend is valid alone: the pair is a conflict, as above.
            both = {"c": app(0, route_prefix="/c"), "d": app(0, route_prefix="/c")}
            body = json.dumps({"backends": both}).encode()
            code, answer = await daemon.http("POST", "/api/v1/apply", body)
            assert code == 409, answer
            assert answer["error"]["type"] == "RouteConflict"
            status = await daemon.status()
            assert set(status) == {"a"}
            # Once a is deleted, b may take its route.
            assert (await daemon.cli("delete", "a", "--wait")).returncode == 0
            assert (await daemon.http("PUT", "/api/v1/backends/b", a))[0] == 200


def test_the_ingress_command_refuses_a_bad_url_at_once(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "controller", "--url", "ftp://x", "--token", "t", "ingress"],
        capture_output=True,
        check=False,
        timeout=LIMIT_S,
        env={**os.environ, "CONTROLLER_STATE_DIR": str(tmp_path)},
    )
    assert result.returncode != 0
    assert b"Traceback" not in result.stderr


async def test_a_daemon_restarted_with_other_options_replaces_its_ingress_then_adopts_it(
    state_dir: Path,
) -> None:
    """Started with other ingress options, the next daemon starts new processes before it stops
    the old ones (no gap on the port), and the one after that adopts the new ones, which answer
    on their own sockets (the old ones' going took nothing of theirs)."""
    file = state_dir / "app.toml"
    file.write_text(manifest(app=app(1)))
    port = free_port()
    base = ("--config", str(file), "--ingress-listen", f"127.0.0.1:{port}")
    with trio.fail_after(LIMIT_S * 3):
        async with trio.open_nursery() as nursery:
            first = Daemon(state_dir)
            await first.start(nursery, *base, "--ingress-workers", "2")
            assert (await first.cli("wait", "app")).returncode == 0
            old = sorted(ingress_pids(state_dir))
            answers: list[int] = []
            stop = trio.Event()

            async def traffic() -> None:
                while not stop.is_set():
                    answers.append((await request(port, "/app/any")).status)
                    await trio.sleep(THINK_S)

            nursery.start_soon(traffic)
            assert await first.stop(signal.SIGINT) == 0
            second = Daemon(state_dir)
            await second.start(nursery, *base, "--ingress-workers", "2", "--access-log")
            new = sorted(ingress_pids(state_dir))
            assert set(new).isdisjoint(old), (old, new)  # replaced: other options
            assert b"of an earlier daemon" in second.log
            # Their sockets, taken over: stopping them reset nothing queued on the port.
            assert second.log.count(b"takes over the listening socket") == 2, second.log
            assert await second.stop(signal.SIGINT) == 0
            third = Daemon(state_dir)
            await third.start(nursery, *base, "--ingress-workers", "2", "--access-log")
            assert sorted(ingress_pids(state_dir)) == new  # adopted
            code, fleet = await third.http("GET", "/api/v1/ingress")
            assert code == 200
            assert all(p["adopted"] and p["answers"] for p in fleet["processes"]), fleet
            assert all(p["since"].endswith("Z") for p in fleet["processes"]), fleet
            # One socket: the first daemon's, which its processes shared, handed on since.
            assert listening_sockets(port) == 1
            stop.set()
            assert await third.stop(signal.SIGINT) == 0
            # Fewer processes: one socket a process still (a slot that is no more closes its
            # socket, rather than handing it on to pile up on the port).
            fourth = Daemon(state_dir)
            await fourth.start(nursery, *base, "--ingress-workers", "1")
            assert listening_sockets(port) == 1
            assert (await fourth.cli("shutdown")).returncode == 0
            assert fourth.process is not None
            assert await fourth.process.wait() == 0
    assert answers
    assert set(answers) == {200}, Counter(answers)


def listening_sockets(port: int) -> int:
    """How many sockets listen on 127.0.0.1:`port` (``/proc/net/tcp``, state 0A)."""
    wanted = f"0100007F:{port:04X}"
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[1] == wanted and line.split()[3] == "0A")


async def test_a_stopped_ingress_process_is_killed_and_replaced_at_once(state_dir: Path) -> None:
    """A process stopped by SIGSTOP answers nothing (its share of new connections waits in its
    accept queue): it is killed once the process table shows it stopped twice, a quarter of a
    second apart, not after three health checks five seconds apart."""
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir, "--ingress-workers", "2") as daemon:
            code, fleet = await daemon.http("GET", "/api/v1/ingress")
            victim = fleet["processes"][1]["pid"]
            began = time.monotonic()
            os.kill(victim, signal.SIGSTOP)
            await daemon.logged(b"was stopped (SIGSTOP?); killing it")
            killed = time.monotonic() - began
            await daemon.logged(b"ingress process 1 serving again")
            serving = time.monotonic() - began
            # For the record (the fourth attack saw 15 s): killed, and a new one serving.
            print(f"stopped process killed after {killed:.2f} s, replaced after {serving:.2f} s")
            code, fleet = await daemon.http("GET", "/api/v1/ingress")
            assert code == 200
            second = fleet["processes"][1]
            assert second["pid"] != victim
            assert second["restarts"] == 1
            assert second["last_exit"] == "was stopped (SIGSTOP?), and was killed"
            # Killed, it could not remove its own sockets: the daemon did.
            assert list((state_dir / "ingress").glob(f"*.{victim}.*")) == []


def test_a_standalone_ingress_refuses_a_port_in_use_unless_told_to_share_it(
    tmp_path: Path,
) -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    argv = [sys.executable, "-m", "controller", "--url", "http://127.0.0.1:1", "--token=t"]
    with held:
        result = subprocess.run(
            [*argv, "ingress", "--listen", f"127.0.0.1:{port}"],
            capture_output=True,
            check=False,
            timeout=LIMIT_S,
            env={**os.environ, "CONTROLLER_STATE_DIR": str(tmp_path)},
        )
    assert result.returncode == 1
    assert b"Address already in use" in result.stderr
    assert b"--share-port" in result.stderr


def test_ingress_workers_are_bounded(tmp_path: Path) -> None:
    for value in ("0", "65", "100000", "x"):
        result = subprocess.run(
            [sys.executable, "-m", "controller", "run", "--ingress-workers", value],
            capture_output=True,
            check=False,
            timeout=LIMIT_S,
            env={**os.environ, "CONTROLLER_STATE_DIR": str(tmp_path)},
        )
        assert result.returncode == 2
        assert b"--ingress-workers: must be a whole number from 1 to 64" in result.stderr


async def _gone(pids: list[int]) -> None:
    """Return once every process of `pids` has exited (their pidfds say so: no polling)."""
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            trio.lowlevel.notify_closing(pidfd)
            os.close(pidfd)


async def test_ingress_processes_no_daemon_follows_stop_after_the_orphan_timeout(
    state_dir: Path,
) -> None:
    port = free_port()
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            daemon = Daemon(state_dir)
            await daemon.start(
                nursery,
                *("--ingress-listen", f"127.0.0.1:{port}", "--ingress-workers", "2"),
                *("--ingress-orphan-timeout", "5"),  # time for a loaded machine to ask it once
            )
            pids = sorted(ingress_pids(state_dir))
            assert len(pids) == 2
            # Stopped by a signal: its ingress processes serve on, for a next daemon...
            assert await daemon.stop(signal.SIGINT) == 0
            assert (await request(port, "/-/healthz")).status == 200
            # ...which does not come: 5 s later they stop, and the port is free.
            await _gone(pids)
    assert listening_sockets(port) == 0
    log = (state_dir / "ingress" / "0.log").read_text()
    assert f"no daemon has run in the state dir {state_dir} for 5s" in log, log
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


async def test_shutdown_with_no_daemon_stops_its_ingress_and_a_held_port_names_them(
    state_dir: Path,
) -> None:
    first, second = state_dir / "a", state_dir / "b"
    port = free_port()
    listen = ("--ingress-listen", f"127.0.0.1:{port}")
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            daemon = Daemon(first)
            await daemon.start(nursery, *listen)
            assert await daemon.stop(signal.SIGINT) == 0
            pids = ingress_pids(first)
            assert len(pids) == 1
            # Another daemon on that port: the error names who holds it and how to stop them.
            other = Daemon(second)
            result = await trio.run_process(
                [*other.cli_argv(), "run", "--listen", "127.0.0.1:0", *listen],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            assert result.returncode == 1
            said = one_line(result.stderr)
            assert f"(pids {pids[0]})" in said, said
            assert f"state dir is {first}, which no longer runs" in said, said
            assert f"`controller --state-dir {first} shutdown` stops them" in said, said
            # That command, with no daemon: it stops what the last one left.
            result = await daemon.cli("shutdown")
            assert result.returncode == 0, result.stderr
            assert f"pid {pids[0]} on 127.0.0.1:{port}" in result.stdout.decode()
            await _gone(pids)
            assert ingress_pids(first) == []
            # Nothing left: said so, and nothing done.
            result = await daemon.cli("shutdown")
            assert result.returncode == 1
            assert b"no ingress process of one is left" in result.stderr
            # The port is free for the other daemon.
            await other.start(nursery, *listen)
            assert (await other.cli("shutdown")).returncode == 0
            assert other.process is not None
            assert await other.process.wait() == 0


async def test_the_ingress_port_accepts_from_the_daemon_s_start(state_dir: Path) -> None:
    """The daemon listens on the ingress port before its API is up, and its first processes
    serve that socket: a script that connects as soon as the daemon answers (the fourth
    attack's `run`, `wait`, `curl`) waits for them, rather than being refused."""
    port = free_port()
    daemon = Daemon(state_dir)
    with trio.fail_after(LIMIT_S * 2):
        async with trio.open_nursery() as nursery:
            daemon.process = await trio.lowlevel.open_process(
                [
                    *daemon.cli_argv(),
                    *("run", "--listen", "127.0.0.1:0"),
                    *("--ingress-listen", f"127.0.0.1:{port}", "--ingress-workers", "2"),
                ],
                stderr=subprocess.PIPE,
            )
            try:
                nursery.start_soon(daemon._read_log, daemon.process, trio.Event())
                await daemon.logged(b"Running on")  # the API: its processes start after it
                assert b"ingress serving routes" not in daemon.log
                stream = await trio.open_tcp_stream("127.0.0.1", port)  # not refused
                async with stream:
                    await stream.send_all(b"GET /-/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    answer = await stream.receive_some(65536)
                assert answer.startswith(b"HTTP/1.1 200 "), answer
                await daemon.logged(b"ingress serving routes")
                # The processes share the daemon's socket: one listens on the port.
                assert listening_sockets(port) == 1
            finally:
                with trio.CancelScope(shield=True):
                    assert (await daemon.cli("shutdown")).returncode == 0
                    assert await daemon.process.wait() == 0


@attrs.define
class Knocks:
    """What a client connecting again and again (a new connection each time) met."""

    refused: list[OSError] = attrs.field(factory=list)
    answered: list[int] = attrs.field(factory=list)


@asynccontextmanager
async def knocking(port: int) -> AsyncIterator[Knocks]:
    """A client asking ``/-/healthz`` of `port` every 20 ms while the block runs."""
    knocks = Knocks()
    stop = trio.Event()

    async def client() -> None:
        while not stop.is_set():
            try:
                answer = await request(port, "/-/healthz")
            except ConnectionRefusedError as exc:
                knocks.refused.append(exc)
            except OSError:
                pass  # a request a process had taken when it was stopped: cut with it
            else:
                knocks.answered.append(answer.status)
            await trio.sleep(0.02)  # a client's pace

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        try:
            yield knocks
        finally:
            stop.set()


async def test_every_ingress_process_stopped_at_once_refuses_no_connection(
    state_dir: Path,
) -> None:
    """Found by a trial: with both processes stopped (SIGSTOP), both were killed and replaced,
    and for half a second nothing listened: connections were refused. The daemon keeps the
    socket its processes share, so connections wait in its queue for the replacements."""
    port = free_port()
    with trio.fail_after(LIMIT_S * 2):
        async with running(
            state_dir, "--ingress-listen", f"127.0.0.1:{port}", "--ingress-workers", "2"
        ) as daemon:
            async with knocking(port) as knocks:
                for pid in ingress_pids(state_dir):
                    os.kill(pid, signal.SIGSTOP)
                await daemon.logged(b"ingress process 0 serving again")
                await daemon.logged(b"ingress process 1 serving again")
            assert knocks.refused == [], knocks.refused
            assert knocks.answered  # the client was served, before and after
            for _ in range(10):  # and the new processes serve
                assert (await request(port, "/-/healthz")).status == 200


async def test_a_daemon_that_adopts_its_ingress_keeps_their_socket_too(state_dir: Path) -> None:
    """A daemon that adopted its processes held no copy of their socket: with both killed at
    once, nothing listened until their replacements had bound sockets of their own (refused),
    and those each had a queue of their own again. It takes a copy, as a fresh daemon does."""
    port = free_port()
    args = ("--ingress-listen", f"127.0.0.1:{port}", "--ingress-workers", "2")
    try:
        with trio.fail_after(LIMIT_S * 3):
            async with trio.open_nursery() as nursery:
                first = Daemon(state_dir)
                await first.start(nursery, *args)
                assert await first.stop(signal.SIGINT) == 0  # its ingress processes serve on
            async with running(state_dir, *args) as daemon:
                adopted = sorted(ingress_pids(state_dir))
                code, fleet = await daemon.http("GET", "/api/v1/ingress")
                assert code == 200
                assert all(p["adopted"] for p in fleet["processes"]), fleet
                async with knocking(port) as knocks:
                    for pid in adopted:
                        os.kill(pid, signal.SIGKILL)
                    await daemon.logged(b"ingress process 0 serving again")
                    await daemon.logged(b"ingress process 1 serving again")
                assert knocks.refused == [], knocks.refused
                assert knocks.answered
                assert listening_sockets(port) == 1  # the replacements serve the one socket
    finally:
        # Whatever happened above, no ingress process is left on the port.
        await trio.run_process(
            [sys.executable, "-m", "controller", "--state-dir", str(state_dir), "shutdown"],
            check=False,
            capture_stdout=True,
            capture_stderr=True,
        )


@contextmanager
def frozen(pid: int) -> Iterator[Callable[[], None]]:
    """Freeze `pid` in a cgroup freezer of its own (it runs nothing, as a stuck process, but is
    not stopped: ``D`` in the process table, as under ``docker pause``); yields a function that
    thaws it. Skips the test where this machine has no freezer we may use."""
    v1 = Path("/sys/fs/cgroup/freezer")
    group = v1 / f"controller-test-{os.getpid()}-{pid}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"no cgroup freezer to use here ({exc})")
    state = group / "freezer.state"
    try:
        (group / "tasks").write_text(str(pid))
        state.write_text("FROZEN")

        def thaw() -> None:
            state.write_text("THAWED")

        yield thaw
    finally:
        state.write_text("THAWED")
        with contextlib.suppress(OSError):  # gone by now, or never moved
            (v1 / "tasks").write_text(str(pid))
        group.rmdir()


async def test_a_stuck_ingress_process_is_killed_within_two_seconds(state_dir: Path) -> None:
    """Found by the fourth attack: a process that runs none of its code but is not stopped (a
    stuck loop; here a frozen cgroup) was killed only after three health checks, 15 s. Its loop
    writes a beat every 0.2 s; one 1.25 s old on two looks in a row gets it killed. Its share
    of the port is not lost meanwhile: the processes share one socket, which a sibling serves."""
    port = free_port()
    with trio.fail_after(LIMIT_S * 2):
        async with running(
            state_dir, "--ingress-listen", f"127.0.0.1:{port}", "--ingress-workers", "2"
        ) as daemon:
            code, fleet = await daemon.http("GET", "/api/v1/ingress")
            victim = fleet["processes"][1]["pid"]
            async with knocking(port) as knocks:
                with frozen(victim) as thaw:
                    began = time.monotonic()
                    await daemon.logged(b"(stuck?); killing it")
                    killed = time.monotonic() - began
                    # A frozen process dies of its SIGKILL only once thawed: its slot is
                    # served anew meanwhile (found by a trial: it waited for the thaw).
                    await daemon.logged(b"(frozen?); starting another beside it")
                    await daemon.logged(b"ingress process 1 serving again")
                    replaced = time.monotonic() - began
                    thaw()
                    await daemon.logged(b"killed before, has exited")
            # For the record (the fourth attack saw 15 s; the target is 2 s).
            print(f"stuck process killed after {killed:.2f} s, replaced after {replaced:.2f} s")
            code, fleet = await daemon.http("GET", "/api/v1/ingress")
            assert code == 200
            second = fleet["processes"][1]
            assert second["pid"] != victim
            assert second["last_exit"].startswith("ran none of its code for "), second
            assert second["last_exit"].endswith("(stuck?), and was killed"), second
            assert knocks.refused == [], knocks.refused
            assert knocks.answered
            assert list((state_dir / "ingress").glob(f"*.{victim}.*")) == []
