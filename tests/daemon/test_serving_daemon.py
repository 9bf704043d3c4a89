"""Code the worker serves, on real workers behind a real daemon's ingress process: each kind of
entrypoint answers; a stream arrives chunk by chunk; a client's hang-up and a backend's
request_timeout_s cancel the handler and give its place back; max_ongoing_requests holds
however many ingresses send; a blocking sync handler does not stop its health checks; a failing
handler answers 500 with its traceback in the replica's log; and rollouts, restarts, canaries
and --reload work for code as for any backend."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from ..daemons import LIMIT_S, Daemon, manifest, running, until
from ..http_client import THINK_S, Conn, request


def code(entrypoint: str, route: str, **fields: Any) -> dict[str, Any]:
    return {
        "entrypoint": f"serving_apps:{entrypoint}",
        "route_prefix": route,
        "num_replicas": 1,
        "version": "v1",
        "graceful_shutdown_timeout_s": 5,
        **fields,
    }


@asynccontextmanager
async def daemon_with(
    state_dir: Path, *extra: str, **backends: dict[str, Any]
) -> AsyncIterator[tuple[Daemon, int]]:
    """A daemon that applied `backends` at start and has them all ready; and its ingress port."""
    file = state_dir / "code.toml"
    file.write_text(manifest(**backends))
    with trio.fail_after(LIMIT_S * 2):
        async with running(state_dir, "--config", str(file), *extra) as daemon:
            for name in backends:
                result = await daemon.cli("wait", name)
                assert result.returncode == 0, result.stderr
            yield daemon, int(daemon.ingress_url.rpartition(":")[2])


async def test_each_kind_of_code_answers_through_the_ingress(state_dir: Path) -> None:
    backends = {
        "fn": code("hello", "/fn"),
        "cls": code("Scaled", "/cls", init_kwargs={"scale": 3}, user_config={"a": 1}),
        "api": code("api", "/api"),
        "life": code("with_lifespan", "/life"),
        "stream": code("tokens", "/stream"),
    }
    async with daemon_with(state_dir, **backends) as (daemon, port):
        assert (await request(port, "/fn?name=ada")).body == b"hello, ada\n"
        seen = (await request(port, "/cls")).json()
        assert (seen["scale"], seen["config"]) == (3, {"a": 1})
        assert seen["tag"].startswith("cls#")
        # A FastAPI app's routes are relative to its route prefix, as under Ray Serve.
        assert (await request(port, "/api/items/3?q=z")).json() == {"item_id": 3, "q": "z"}
        assert (await request(port, "/api/items/0")).status == 404
        started = (await request(port, "/life/state")).json()["started"]
        assert started == (await daemon.status())["life"]["replicas"][0]["pid"]
        assert (await request(port, "/stream?n=3&delay=0")).body == b"token0 token1 token2 "
        # Its log says where it serves; status counts what each replica answered.
        logs = await daemon.cli("logs", "fn")
        assert b"serving HTTP on 127.0.0.1:" in logs.stdout
        assert b"(serving_apps:hello, a function)" in logs.stdout
        for _ in range(4):
            assert (await request(port, "/fn")).status == 200
        status = await until(daemon, "fn", lambda s: sum(s["load"]["served"].values()) == 5)
        (tag,) = status["load"]["served"]
        table = (await daemon.cli("status", "fn")).stdout.decode()
        assert "SERVED" in table
        assert any(tag in line and line.split()[-1] == "5" for line in table.splitlines())
        _, metrics = await daemon.http("GET", "/metrics")
        served = f'controller_replica_requests_served_total{{backend="fn",replica="{tag}"}} 5.0'
        assert served in metrics


async def test_a_stream_arrives_chunk_by_chunk_through_the_ingress(state_dir: Path) -> None:
    async with daemon_with(state_dir, stream=code("tokens", "/stream")) as (_, port):
        conn = await Conn.open(port)
        async with conn.stream:
            began = trio.current_time()
            await conn.stream.send_all(b"GET /stream?n=4&delay=0.4 HTTP/1.1\r\nHost: h\r\n\r\n")
            got = b""
            while b"token0" not in got:
                got += await conn.stream.receive_some(65536)
            first_at = trio.current_time() - began
            while not got.endswith(b"0\r\n\r\n"):
                got += await conn.stream.receive_some(65536)
            whole_at = trio.current_time() - began
        assert b"token3" in got
        # Four tokens 0.4 s apart: the first reached the client three gaps before the last.
        assert whole_at >= 1.6
        assert first_at <= whole_at - 0.8


async def test_a_hang_up_and_a_deadline_cancel_the_handler_and_give_its_place_back(
    state_dir: Path,
) -> None:
    backends = {
        "count": code("Counting", "/count", max_ongoing_requests=4),
        "timed": code("Counting", "/timed", request_timeout_s=0.5),
    }
    async with daemon_with(state_dir, **backends) as (daemon, port):
        # A client that hangs up: its handler (10 s of sleep) is cancelled, counted by itself.
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /count/sleep?s=10 HTTP/1.1\r\nHost: h\r\n\r\n")
        inside = (await request(port, "/count/stats?until=inside&n=1")).json()
        assert inside["inside"] == 1
        hung_up = trio.current_time()
        sock.close()
        stats = (await request(port, "/count/stats?until=cancelled&n=1")).json()
        assert (stats["cancelled"], stats["inside"]) == (1, 0)
        assert trio.current_time() - hung_up < 5  # far under its 10 s (the figure: the bench)
        # Past request_timeout_s: 504, and the handler cancelled.
        began = trio.current_time()
        late = await request(port, "/timed/sleep?s=10")
        assert late.status == 504, late.body
        assert 0.5 <= trio.current_time() - began < 5
        stats = (await request(port, "/timed/stats?until=cancelled&n=1")).json()
        assert (stats["cancelled"], stats["inside"]) == (1, 0)
        # Every place taken is given back: at the ingress, and in the replica.
        for _ in range(5):
            assert (await request(port, "/timed/quick")).status == 200
        await until(daemon, "timed", lambda s: s["load"]["in_flight"] == 0)


async def test_max_ongoing_requests_holds_in_the_replica_whatever_the_ingresses_send(
    state_dir: Path,
) -> None:
    # Two ingress processes, each allowed 10 at the replica: the replica runs 10 at most.
    backend = code("Counting", "/count", max_ongoing_requests=10, max_queued_requests=1000)
    async with daemon_with(state_dir, "--ingress-workers", "2", count=backend) as (_, port):
        statuses: list[int] = []

        async def one() -> None:
            statuses.append((await request(port, "/count/sleep?s=0.1")).status)

        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(one)
        assert statuses == [200] * 200
        stats = (await request(port, "/count/stats")).json()
        assert stats["most"] <= 10
        assert stats["finished"] == 200


async def test_a_blocking_sync_handler_does_not_stop_its_health_checks(state_dir: Path) -> None:
    backend = code(
        "Blocking",
        "/block",
        max_ongoing_requests=8,
        health_check_period_s=0.2,
        health_check_timeout_s=1,
        health_check_failure_threshold=1,
    )
    async with daemon_with(state_dir, block=backend) as (daemon, port):
        (before,) = [r["tag"] for r in (await daemon.status())["block"]["replicas"]]
        checks_before = (await request(port, "/block")).json()["checks"]
        answers: list[dict[str, Any]] = []

        async def blocked() -> None:
            answers.append((await request(port, "/block?s=3")).json())

        async with trio.open_nursery() as nursery:
            for _ in range(8):  # every handler thread it has, blocked for 3 s
                nursery.start_soon(blocked)
        # Checked meanwhile, every one passed: the replica was never replaced.
        assert max(a["checks"] for a in answers) >= checks_before + 3
        status = (await daemon.status())["block"]
        assert [r["tag"] for r in status["replicas"]] == [before]
        assert status["replicas"][0]["healthy"]


async def test_a_failing_handler_answers_500_with_its_traceback_in_the_log(
    state_dir: Path,
) -> None:
    async with daemon_with(state_dir, boom=code("boom", "/boom")) as (daemon, port):
        answer = await request(port, "/boom/x")
        assert answer.status == 500
        assert b"Traceback" not in answer.body
        assert b"a failure of the user's own" not in answer.body
        logs = (await daemon.cli("logs", "boom")).stdout.decode()
        assert "GET /boom/x failed" in logs
        assert "ValueError: a failure of the user's own" in logs
        assert "serving_apps.py" in logs


async def test_an_app_whose_startup_fails_fails_its_start_and_says_why(state_dir: Path) -> None:
    async with running(state_dir) as daemon:
        body = json.dumps(code("failing_startup", "/bad", start_timeout_s=20)).encode()
        code_, data = await daemon.http("PUT", "/api/v1/backends/bad", body)
        assert code_ == 200, data
        status = await until(daemon, "bad", lambda s: s["last_error"])
        assert "the model file is missing" in status["last_error"]


async def test_rollouts_restarts_and_canaries_work_for_code(state_dir: Path) -> None:
    async with daemon_with(state_dir, fn=code("hello", "/fn", num_replicas=2)) as (daemon, port):
        before = {r["tag"] for r in (await daemon.status())["fn"]["replicas"]}
        result = await daemon.cli("rollout", "restart", "fn", "--wait")
        assert result.returncode == 0, result.stderr
        after = {r["tag"] for r in (await daemon.status())["fn"]["replicas"]}
        assert after
        assert not after & before
        assert (await request(port, "/fn")).status == 200
        # A new version as a canary: a share of the traffic first, then promoted.
        canary = code(
            "describe",
            "/fn",
            num_replicas=2,
            version="v2",
            # Not a test of the gates: a busy machine's slow answers must not abort it.
            canary={"steps": [{"weight": 50, "pause_s": 1}], "min_requests": 5, "p99_slack_s": 5},
        )
        file = state_dir / "v2.toml"
        file.write_text(manifest(fn=canary))
        applied = await daemon.cli("apply", "-f", str(file))
        assert applied.returncode == 0, applied.stderr
        kinds: set[bytes] = set()

        async def traffic(done: trio.Event) -> None:
            while not done.is_set():
                answer = await request(port, "/fn")
                assert answer.status == 200
                kinds.add(answer.body[:1])
                await trio.sleep(THINK_S)

        done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(traffic, done)
            await until(daemon, "fn", lambda s: s["rollout"]["canary"] is not None)
            status = await until(
                daemon,
                "fn",
                lambda s: (
                    s["version"] == "v2"
                    and s["state"] == "HEALTHY"
                    and all(r["version"] == "v2" for r in s["replicas"])
                ),
            )
            done.set()
        assert status["rollout"]["canary"]["phase"] == "promoted"
        assert kinds == {b"h", b"{"}  # both releases answered during the canary


async def test_reload_restarts_code_when_its_file_changes(state_dir: Path, tmp_path: Path) -> None:
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    shutil.copy(Path(__file__).parent.parent / "serving_apps.py", code_dir / "reloaded.py")
    (code_dir / "reloaded.py").write_text(
        (code_dir / "reloaded.py").read_text() + "\n\ndef version(request): return 'one'\n"
    )
    backend = {**code("hello", "/v"), "entrypoint": "reloaded:version"}
    async with daemon_with(state_dir, "--reload", "--pythonpath", str(code_dir), v=backend) as (
        daemon,
        port,
    ):
        assert (await request(port, "/v")).body == b"one"
        text = (code_dir / "reloaded.py").read_text().replace("return 'one'", "return 'two'")
        (code_dir / "reloaded.py").write_text(text)
        await until(
            daemon,
            "v",
            lambda s: s["state"] == "HEALTHY" and s["rollout"]["revision"] >= 2,
        )
        assert (await request(port, "/v")).body == b"two"


async def test_a_change_of_the_limits_reaches_the_replicas_without_a_restart(
    state_dir: Path,
) -> None:
    backend = code("Counting", "/count", max_ongoing_requests=2, request_timeout_s=0.5)
    async with daemon_with(state_dir, count=backend) as (daemon, port):
        (tag,) = [r["tag"] for r in (await daemon.status())["count"]["replicas"]]

        async def burst(seconds: float) -> list[int]:
            statuses: list[int] = []

            async def one() -> None:
                statuses.append((await request(port, f"/count/sleep?s={seconds}")).status)

            async with trio.open_nursery() as nursery:
                for _ in range(12):
                    nursery.start_soon(one)
            return statuses

        assert await burst(0.02) == [200] * 12  # in line, well within the 0.5 s
        assert (await request(port, "/count/stats")).json()["most"] == 2
        assert (await request(port, "/count/sleep?s=1")).status == 504
        # Raised in the config: the ingress says so with each request, and the replica holds
        # to it at once, the same replica.
        file = state_dir / "raised.toml"
        file.write_text(
            manifest(count={**backend, "max_ongoing_requests": 6, "request_timeout_s": 5})
        )
        assert (await daemon.cli("apply", "-f", str(file), "--wait")).returncode == 0
        assert await burst(0.3) == [200] * 12
        stats = (await request(port, "/count/stats")).json()
        assert stats["tag"] == tag
        assert stats["most"] == 6
        assert (await request(port, "/count/sleep?s=1")).status == 200


async def test_a_replica_whose_handler_threads_are_all_stuck_is_replaced(
    state_dir: Path,
) -> None:
    backend = code(
        "stuck",
        "/stuck",
        max_ongoing_requests=2,
        request_timeout_s=0.3,
        health_check_period_s=0.2,
        health_check_failure_threshold=1,
    )
    async with daemon_with(state_dir, stuck=backend) as (daemon, port):
        (before,) = [r["tag"] for r in (await daemon.status())["stuck"]["replicas"]]
        for _ in range(2):  # each holds one of its two threads for good
            assert (await request(port, "/stuck")).status == 504
        status = await until(
            daemon,
            "stuck",
            lambda s: any(r["tag"] != before for r in s["replicas"] if r["state"] == "RUNNING"),
        )
        events = " ".join(e["message"] for e in status["events"])
        assert "threads are all held" in events, events


async def test_an_app_that_needs_asyncio_runs_on_asyncio(state_dir: Path) -> None:
    backend = {**code("hello", "/aio"), "entrypoint": "asyncio_apps:app"}
    async with daemon_with(state_dir, aio=backend) as (_, port):
        slept = (await request(port, "/aio/sleep?s=0.02")).json()
        assert slept["slept"] == 0.02
        assert "TrioEventLoop" in slept["started_on"]  # trio-asyncio's loop, in the lifespan
        assert (await request(port, "/aio/stream")).body == b"one two three "
        # A client that hangs up mid-request cancels its asyncio task too.
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /aio/sleep?s=30 HTTP/1.1\r\nHost: h\r\n\r\n")
        sock.close()
        assert (await request(port, "/aio/sleep?s=0")).status == 200
