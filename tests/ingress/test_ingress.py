"""The ingress end to end, on real worker processes: routes, traffic through scaling, rollouts
and drains, a replica killed mid-traffic, admission control, power of two choices against a
slow replica, a client that hangs up, streaming bodies, and every fault the issue names."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import controller
from controller.ingress import ControllerSource, Ingress, IngressConfig, open_listener

from ..http_client import Conn, raw, request

HERE = Path(__file__).parent.parent
LIMIT_S = int(os.environ.get("T_LIMIT", "60"))
RC = controller.ReplicaConfig("http_replica:HTTPReplica")


def routed(prefix: str = "/app", **kwargs: Any) -> controller.BackendConfig:
    kwargs.setdefault("num_replicas", 2)
    kwargs.setdefault("version", "v1")
    kwargs.setdefault("health_check_period_s", 0)
    kwargs.setdefault("graceful_shutdown_timeout_s", 10)
    return controller.BackendConfig(route_prefix=prefix, **kwargs)


@attrs.define
class Front:
    ctl: controller.Controller
    ingress: Ingress
    port: int
    runtime: controller.LocalRuntime

    async def deploy(
        self, name: str, config: controller.BackendConfig, rc: controller.ReplicaConfig = RC
    ) -> None:
        await (await self.ctl.deploy(name, config, rc)).wait()
        # The ingress holds the snapshot the goal was reached with (it follows the same hub).
        await self.wait_routed(name, config.num_replicas)

    async def wait_routed(self, name: str, count: int, *, without: str = "") -> None:
        """Wait until the ingress routes to `count` replicas of `name`, none of them
        `without`."""
        while True:
            held = self.ctl.snapshot(name).snapshot_id
            await trio.testing.wait_all_tasks_blocked()  # the ingress has taken `held`
            backend = self.ingress.backend(name)
            if (
                backend is not None
                and len(backend.slots) == count
                and without not in backend.by_tag
            ):
                return
            await self.ctl.listen_for_change({name: held})

    def pids(self, name: str) -> dict[str, int]:
        return {r.tag: r.pid for r in self.ctl.status(name).replicas if r.pid is not None}


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ig", dir="/tmp"))  # short: Unix socket paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


@asynccontextmanager
async def front(runtime_dir: Path, config: IngressConfig | None = None) -> AsyncIterator[Front]:
    runtime = controller.LocalRuntime(runtime_dir / "w", pythonpath=[HERE])
    async with (
        controller.open_controller(runtime=runtime, store=controller.MemoryStore()) as ctl,
        trio.open_nursery() as nursery,
    ):
        ingress = Ingress(ControllerSource(ctl), config or IngressConfig())
        await nursery.start(ingress.run)
        listener = await open_listener("127.0.0.1", 0)
        await nursery.start(ingress.serve, [listener])
        try:
            yield Front(ctl, ingress, listener.socket.getsockname()[1], runtime)
        finally:
            for status in ctl.status().backends:
                await ctl.delete(status.name, force=True)
            with trio.move_on_after(30):
                await ctl.wait_until(lambda c: not c.status().backends)
            nursery.cancel_scope.cancel()


async def test_routes_lead_to_their_backends_and_unknown_ones_list_the_routes(
    runtime_dir: Path,
) -> None:
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir) as f:
            await f.deploy("app", routed("/app"))
            await f.deploy("v1", routed("/app/v1", num_replicas=1))
            answer = await request(f.port, "/app/x?q=1", headers=[("X-Forwarded-For", "10.0.0.1")])
            assert answer.status == 200
            seen = answer.json()
            assert seen["replica"].startswith("app#")
            assert seen["path"] == "/app/x?q=1"  # passed on whole, as Kubernetes does
            assert seen["headers"]["x-forwarded-prefix"] == "/app"
            assert seen["headers"]["x-forwarded-for"] == "10.0.0.1, 127.0.0.1"
            # The daemon's console session is sent by browsers to every port of the host, this
            # one too: it never reaches a replica; the site's own cookies do.
            cookies = "a=1; controller_session_7070=s.e.c; controller_session=x; b=2"
            seen = (await request(f.port, "/app/c", headers=[("Cookie", cookies)])).json()
            assert seen["headers"]["cookie"] == "a=1; b=2"
            seen = (
                await request(f.port, "/app/c", headers=[("Cookie", "controller_session_1=s")])
            ).json()
            assert "cookie" not in seen["headers"]
            assert (await request(f.port, "/app/v1/y")).json()["replica"].startswith("v1#")
            assert (await request(f.port, "/app/v10")).json()["replica"].startswith("app#")
            missing = await request(f.port, "/nope")
            assert missing.status == 404
            assert missing.json()["error"]["routes"] == {"/app": "app", "/app/v1": "v1"}
            assert (await request(f.port, "/-/routes")).json() == {"/app": "app", "/app/v1": "v1"}
            # Changing the route moves it, and restarts no replica.
            pids = f.pids("app")
            await (await f.ctl.deploy("app", routed("/other"), RC)).wait()
            while (await request(f.port, "/other")).status != 200:
                await f.ctl.listen_for_change({"app": f.ctl.snapshot("app").snapshot_id})
            assert f.pids("app") == pids
            assert (await request(f.port, "/app")).status == 404


async def test_traffic_through_scaling_rolling_and_draining_fails_nothing(
    runtime_dir: Path,
) -> None:
    counts: Counter[int] = Counter()
    with trio.fail_after(LIMIT_S * 2):
        async with front(runtime_dir) as f:
            await f.deploy("app", routed(num_replicas=2))
            stop = trio.Event()

            async def client() -> None:
                conn = await Conn.open(f.port)
                try:
                    while not stop.is_set():
                        try:
                            counts[(await conn.request("/app/slow?ms=5")).status] += 1
                        except ConnectionError:
                            counts[-1] += 1
                            await conn.aclose()
                            conn = await Conn.open(f.port)
                finally:
                    await conn.aclose()

            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(client)
                for step in (
                    routed(num_replicas=4),
                    routed(num_replicas=4, version="v2"),
                    routed(num_replicas=4, version="v2", user_config={"k": 1}),
                    routed(num_replicas=1, version="v2", user_config={"k": 1}),
                    routed(num_replicas=3, version="v3", max_surge=1, max_unavailable=0),
                ):
                    await (await f.ctl.deploy("app", step, RC)).wait()
                stop.set()
    assert counts[200] > 200
    assert set(counts) == {200}, counts


async def test_a_replica_killed_mid_traffic_gives_answers_or_502s_and_never_a_hang(
    runtime_dir: Path,
) -> None:
    counts: Counter[int] = Counter()
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir) as f:
            await f.deploy("app", routed(num_replicas=2))
            gone, victim = next(iter(f.pids("app").items()))
            done = trio.Event()

            async def client() -> None:
                while not done.is_set():
                    try:
                        counts[(await request(f.port, "/app/slow?ms=20")).status] += 1
                    except ConnectionError:
                        counts[-1] += 1

            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(client)
                # Traffic under way on both replicas (the ingress reports it in flight).
                await f.ctl.wait_until(lambda c: len(c.status("app").load.replicas) == 2)
                os.kill(victim, signal.SIGKILL)
                # Replaced (a new replica serves) while the traffic goes on. Not waited for
                # as 1 routed, then 2: at load 10 that wait once hung after the death was
                # handled, likely because the replacement was routed before the test looked
                # (a 1 come and gone; not proven, the log kept no more).
                await f.wait_routed("app", 2, without=gone)
                done.set()
    # -1: a response cut short (the replica died after its head went out): the client sees a
    # broken response, never a hang, and never a 200 for a request that failed.
    assert set(counts) <= {200, 502, -1}, counts
    assert counts[502] + counts[-1] <= 8  # only what was in flight in the killed replica
    assert counts[200] > 50


async def test_a_full_backend_queues_then_answers_503_with_retry_after(runtime_dir: Path) -> None:
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir, IngressConfig(queue_timeout_s=5)) as f:
            await f.deploy(
                "app", routed(num_replicas=1, max_ongoing_requests=1, max_queued_requests=1)
            )
            answers: list[tuple[int, str, str | None]] = []

            async def one(path: str) -> None:
                answer = await request(f.port, path)
                kind = answer.json().get("error", {}).get("type", "ok")
                answers.append((answer.status, kind, answer.headers.get("retry-after")))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, "/app/slow?ms=600")
                await f.ctl.wait_until(lambda c: c.status("app").load.in_flight == 1)
                nursery.start_soon(one, "/app/slow?ms=10")  # waits in the queue
                await f.ctl.wait_until(lambda c: c.status("app").load.queued == 1)
                await one("/app/slow?ms=10")  # the queue is full
            assert answers[0] == (503, "Overloaded", "1")
            assert sorted(answers[1:]) == [(200, "ok", None), (200, "ok", None)]
            rejected = f.ingress.metrics.rejected_by[("app", "queue_full")]
            assert rejected == 1


async def test_a_request_that_waits_past_the_queue_timeout_gets_503(runtime_dir: Path) -> None:
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir, IngressConfig(queue_timeout_s=0.2)) as f:
            await f.deploy("app", routed(num_replicas=1, max_ongoing_requests=1))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(request, f.port, "/app/slow?ms=1500")
                await f.ctl.wait_until(lambda c: c.status("app").load.in_flight == 1)
                answer = await request(f.port, "/app")
            assert answer.status == 503
            assert answer.json()["error"]["type"] == "QueueTimeout"
            assert answer.headers["retry-after"] == "1"


async def test_a_slow_replica_receives_fewer_requests(runtime_dir: Path, tmp_path: Path) -> None:
    served: Counter[str] = Counter()
    slow_rc = controller.ReplicaConfig(
        "http_replica:HTTPReplica",
        init_kwargs={"delay_ms": 50, "slow_claim": str(tmp_path / "slow")},
    )
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir) as f:
            await f.deploy("app", routed(num_replicas=2), slow_rc)

            async def client() -> None:
                conn = await Conn.open(f.port)
                with trio.move_on_after(3):
                    while True:
                        served[(await conn.request("/app")).json()["replica"]] += 1
                await conn.aclose()

            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(client)
    (slow, fast) = sorted(served.values())
    # Round robin would send each half; the slow one (50 ms a request) gets far fewer.
    assert slow / (slow + fast) < 0.2, served


async def test_a_request_a_replica_dies_with_goes_to_another_when_it_may_be_sent_twice(
    runtime_dir: Path, tmp_path: Path
) -> None:
    """A replica that closes the connection without a byte of answer (its node lost, its
    process killed mid-request): a GET goes to another replica, as a refused connection does;
    a POST with a body, which it may have acted on, gets 502."""
    dropping = controller.ReplicaConfig(
        "http_replica:HTTPReplica", init_kwargs={"slow_claim": str(tmp_path / "drop")}
    )
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir) as f:
            await f.deploy("app", routed(num_replicas=2), dropping)
            # First the POSTs: a GET it dropped would count against the replica and shun it.
            posts = [
                await request(f.port, "/app/drop", method="POST", body=b"x") for _ in range(20)
            ]
            assert {a.status for a in posts} == {200, 502}
            dropped = [a.json()["error"]["message"] for a in posts if a.status == 502]
            assert all("closed the connection without answering" in m for m in dropped)
            answers = [await request(f.port, "/app/drop") for _ in range(20)]
            assert {a.status for a in answers} == {200}


async def test_a_client_that_hangs_up_cancels_its_request_at_the_replica(
    runtime_dir: Path, tmp_path: Path
) -> None:
    fifo = tmp_path / "record"
    os.mkfifo(fifo)
    rc = controller.ReplicaConfig("http_replica:HTTPReplica", init_kwargs={"record": str(fifo)})
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir) as f:
            await f.deploy("app", routed(num_replicas=1), rc)
            reader = trio.lowlevel.FdStream(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
            lines = bytearray()

            async def read_line() -> bytes:
                while b"\n" not in lines:
                    lines.extend(await reader.receive_some(100))
                line, _, rest = bytes(lines).partition(b"\n")
                lines[:] = rest
                return line

            conn = await Conn.open(f.port)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.request, "/app/watch-cancel")
                assert await read_line() == b"waiting"
                assert f.ctl.status("app").load.in_flight in (0, 1)
                nursery.cancel_scope.cancel()
            await conn.aclose()
            assert await read_line() == b"cancelled"
            await f.ctl.wait_until(lambda c: c.status("app").load.in_flight == 0)
            await reader.aclose()


async def test_bodies_stream_both_ways(runtime_dir: Path) -> None:
    import hashlib

    size = 64 << 20
    digest = hashlib.sha256()

    async def body() -> AsyncIterator[bytes]:
        chunk = os.urandom(1 << 20)
        for _ in range(size >> 20):
            digest.update(chunk)
            yield chunk

    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir) as f:
            await f.deploy("app", routed(num_replicas=1))
            answer = await request(f.port, "/app/sha", method="POST", body=body())
            assert answer.json() == {"length": size, "sha256": digest.hexdigest()}
            sized = os.urandom(3 << 20)
            answer = await request(f.port, "/app/sha", method="POST", body=sized)
            assert answer.json()["sha256"] == hashlib.sha256(sized).hexdigest()
            streamed = await request(f.port, "/app/stream?n=256")
            assert len(streamed.body) == 256 * 65536
            # Connections to replicas are kept and reused: 20 requests open at most one.
            opened = f.ingress.proxy.pool.opened
            conn = await Conn.open(f.port)
            for _ in range(20):
                assert (await conn.request("/app")).status == 200
            await conn.aclose()
            assert f.ingress.proxy.pool.opened - opened <= 1


async def test_bad_input_and_bad_replicas_get_clear_answers_not_hangs(runtime_dir: Path) -> None:
    config = IngressConfig(header_timeout_s=0.3, request_timeout_s=0.5, keepalive_timeout_s=5)
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir, config) as f:
            await f.deploy("app", routed(num_replicas=1))
            await f.deploy("empty", routed("/empty", num_replicas=0))
            assert (await raw(f.port, b"NOT HTTP AT ALL\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
            huge = b"GET /app HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
            assert (await raw(f.port, huge)).startswith(b"HTTP/1.1 431 ")
            # A head that never ends: 408 after header_timeout_s.
            slow = await raw(f.port, b"GET /app HTTP/1.1\r\nHost: x\r\n")
            assert slow.startswith(b"HTTP/1.1 408 "), slow
            # A replica that accepts and never answers: 504 after request_timeout_s.
            hung = await request(f.port, "/app/hang")
            assert hung.status == 504
            assert hung.json()["error"]["type"] == "GatewayTimeout"
            # A replica that closes mid-answer: the client sees a broken answer, at once.
            with pytest.raises(ConnectionError):
                await request(f.port, "/app/cut")
            # A route with no replica: 503 at once.
            with trio.fail_after(1):
                empty = await request(f.port, "/empty")
            assert empty.status == 503
            assert empty.json()["error"]["type"] == "NoReplicas"
            assert (await request(f.port, "/app")).status == 200  # and it still serves
            # A head past the limit that arrives in one piece is measured too.
            whole = b"GET /app HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 66_000 + b"\r\n\r\n"
            assert (await raw(f.port, whole)).startswith(b"HTTP/1.1 431 ")
            # A body that breaks its own chunked framing: 400, not a silent close.
            for body in (b"zz\r\nhello\r\n0\r\n\r\n", b"3\r\nhello\r\n0\r\n\r\n"):
                head = b"POST /app/sha HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                assert (await raw(f.port, head + body)).startswith(b"HTTP/1.1 400 ")
            # An HTTP/1.0 request with no Host still reaches the replica.
            old = await raw(f.port, b"GET /app HTTP/1.0\r\n\r\n")
            assert old.startswith(b"HTTP/1.1 200 "), old
            assert (await request(f.port, "/-/nope")).status == 404  # the ingress's own paths
            # A head padded with spaces is measured as sent, not as parsed.
            padded = b"GET /app HTTP/1.1\r\nHost: x\r\nX-Pad: a" + b" " * 70_000 + b"a\r\n\r\n"
            assert (await raw(f.port, padded)).startswith(b"HTTP/1.1 431 ")
            # Waiting for a 100 Continue that a 404 will not send: answered at once.
            with trio.fail_after(2):
                expecting = await raw(
                    f.port,
                    b"POST /nope HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                    b"Content-Length: 5\r\n\r\n",
                )
            assert expecting.startswith(b"HTTP/1.1 404 ")
            # The headers that frame the request cannot be named away by Connection.
            framed = await raw(
                f.port,
                b"POST /app/sha HTTP/1.1\r\nHost: x\r\nConnection: close, Content-Length\r\n"
                b"Content-Length: 4\r\n\r\nabcd",
            )
            assert b'"length": 4' in framed


async def test_a_stalled_body_gets_408_and_the_access_log_says_so(
    runtime_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = IngressConfig(body_timeout_s=0.3, access_log=True)
    caplog.set_level(logging.INFO, logger="controller.ingress.access")
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir, config) as f:
            await f.deploy("app", routed(num_replicas=1))
            head = b"POST /app/sha HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"
            assert (await raw(f.port, head)).startswith(b"HTTP/1.1 408 ")
            assert (await request(f.port, "/app/x")).status == 200
            await trio.testing.wait_all_tasks_blocked()
    lines = [r for r in caplog.records if r.name == "controller.ingress.access"]
    fields = [r.__dict__["fields"] for r in lines]
    assert [(x["method"], x["target"], x["backend"], x["status"]) for x in fields] == [
        ("POST", "/app/sha", "app", 408),
        ("GET", "/app/x", "app", 200),
    ]


async def test_a_request_is_never_passed_on_two_ways_to_read(runtime_dir: Path) -> None:
    """Transfer-Encoding and Content-Length together (request smuggling): refused with 400 and
    the connection closed (RFC 9112 6.1), so the smuggled request in its body reaches no
    replica and no later client gets its answer. Headers the Connection header names stay on
    the client's hop."""
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir) as f:
            await f.deploy("app", routed(num_replicas=1))
            inner = b"GET /app/SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n"
            body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(inner), inner)
            for framing in (
                b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
            ):
                attack = b"POST /app/sha HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n" + body
                answer = await raw(f.port, attack)  # read until the ingress closes
                assert answer.startswith(b"HTTP/1.1 400 "), answer
                assert b"connection: close" in answer
                assert answer.count(b"HTTP/1.1") == 1  # the inner request was never served
            for _ in range(5):
                victim = await request(f.port, "/app/victim")
                assert victim.json()["path"] == "/app/victim"
            seen = await raw(
                f.port,
                b"GET http://elsewhere.example/app/abs?q=1 HTTP/1.1\r\nHost: x\r\n"
                b"Connection: close, X-Secret\r\nX-Secret: s\r\n\r\n",
            )
            payload = json.loads(seen.partition(b"\r\n\r\n")[2])
            assert payload["path"] == "/app/abs?q=1"  # origin form
            assert payload["headers"]["host"] == "elsewhere.example"
            assert "x-secret" not in payload["headers"]


async def test_a_replica_that_leaves_bytes_unread_or_extra_never_mixes_up_clients(
    runtime_dir: Path,
) -> None:
    """Connections to replicas are reused only when nothing was left unread on either side:
    a body the replica did not read would be taken for the next request (smuggling), and bytes
    it sent past its answer for the next answer."""
    config = IngressConfig(body_timeout_s=0.5)
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir, config) as f:
            await f.deploy("app", routed(num_replicas=1))
            inner = b"GET /app/SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n"
            answer = await request(f.port, "/app/any", method="POST", body=inner)
            assert answer.status == 200  # the replica answered without reading the body
            assert (await request(f.port, "/app/stray")).body == b"ok"
            for n in range(5):
                victim = await request(f.port, f"/app/victim{n}")
                assert victim.status == 200
                assert victim.json()["path"] == f"/app/victim{n}"
            # A large upload to a replica that answered early and stopped reading: the client
            # hears within body_timeout_s, and the replica's slot is free again.
            assert await _upload_to_early(f.port) == b"HTTP/1.1 502 "
            await f.ctl.wait_until(lambda c: c.status("app").load.in_flight == 0)


async def _upload_to_early(port: int) -> bytes:
    """POST 64 MiB to a replica that answers 413 at once and reads no more, reading the answer
    while sending (as a browser does); the first bytes of the ingress's answer."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    size = 64 << 20
    head = b"POST /app/early HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size

    async def send() -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(head)
            for _ in range(size >> 20):
                await stream.send_all(b"x" * (1 << 20))

    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(send)
        answer = bytearray()
        while len(answer) < 13:
            chunk = await stream.receive_some(100)
            if not chunk:
                break
            answer += chunk
        nursery.cancel_scope.cancel()
    return bytes(answer[:13])


async def test_past_max_connections_the_longest_idle_makes_room_else_newcomers_are_refused(
    runtime_dir: Path,
) -> None:
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir, IngressConfig(max_connections=2)) as f:
            await f.deploy("app", routed(num_replicas=1))
            oldest, newer = await Conn.open(f.port), await Conn.open(f.port)
            assert (await oldest.request("/app")).status == 200
            assert (await newer.request("/app")).status == 200
            # A third: the connection idle the longest is closed to make room for it.
            third = await Conn.open(f.port)
            assert (await third.request("/app")).status == 200
            with pytest.raises(ConnectionError):
                await oldest.request("/app")
            assert (await newer.request("/app")).status == 200
            # With both busy (a request under way on each), a newcomer is closed unserved.
            async with trio.open_nursery() as nursery:
                for conn in (newer, third):
                    nursery.start_soon(conn.request, "/app/slow?ms=1500")
                await f.ctl.wait_until(lambda c: c.status("app").load.in_flight == 2)
                refused = await raw(f.port, b"GET /app HTTP/1.1\r\nHost: x\r\n\r\n")
                assert refused == b""
            assert f.ingress.metrics.refused_by == {"evicted": 1, "limit": 1}
            for conn in (oldest, newer, third):
                await conn.aclose()


async def test_the_controller_sees_the_load_and_metrics_count_it(runtime_dir: Path) -> None:
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir) as f:
            await f.deploy("app", routed(num_replicas=2))
            conns = [await Conn.open(f.port) for _ in range(3)]
            async with trio.open_nursery() as nursery:
                for conn in conns:
                    nursery.start_soon(conn.request, "/app/hang")
                await f.ctl.wait_until(lambda c: c.status("app").load.in_flight == 3)
                load = f.ctl.status("app").load
                assert load.sources == 1
                assert sum(load.replicas.values()) == 3
                assert set(load.replicas) <= set(f.pids("app"))
                nursery.cancel_scope.cancel()
            for conn in conns:
                await conn.aclose()
            await f.ctl.wait_until(lambda c: c.status("app").load.in_flight == 0)
            for _ in range(5):
                await request(f.port, "/app")
            await trio.testing.wait_all_tasks_blocked()  # every exchange has been counted
            text = (await request(f.port, "/-/metrics")).body.decode()
            counted = {
                line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
                for line in text.splitlines()
                if line.startswith("ingress_requests_total")
            }
            assert counted == {
                'ingress_requests_total{backend="app",code="200",route="/app"}': 5,
                'ingress_requests_total{backend="app",code="499",route="/app"}': 3,
            }


async def test_connections_pooled_to_a_replica_that_left_mid_request_are_closed_after_it(
    runtime_dir: Path,
) -> None:
    with trio.fail_after(LIMIT_S):
        async with front(runtime_dir) as f:
            await f.deploy("app", routed("/app", num_replicas=1))
            (tag,) = f.pids("app")
            address = f.ingress.backend("app").by_tag[tag].address  # type: ignore[union-attr]
            # Several requests at once: their connections go to the pool when they end.
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(request, f.port, "/app/any")
            assert f.ingress.proxy.pool._idle.get(address)
            # One more, held while the replica leaves (scaled to 0; its drain waits for it).
            async with trio.open_nursery() as nursery:
                nursery.start_soon(request, f.port, "/app/slow?ms=1500")
                await f.wait_routed("app", 1)
                await _in_flight(f, tag)
                await f.ctl.deploy("app", routed("/app", num_replicas=0), RC)
                await f.wait_routed("app", 0)
                # It left with one in flight: its pooled connections wait for that one.
            await trio.testing.wait_all_tasks_blocked()  # the ingress is done with it too
            assert not f.ingress.proxy.pool._idle.get(address)


async def _in_flight(f: Front, tag: str) -> None:
    """Wait until the ingress has a request in flight to `tag`."""
    while True:
        backend = f.ingress.backend("app")
        assert backend is not None
        if backend.by_tag[tag].in_flight:
            return
        await trio.testing.wait_all_tasks_blocked(cushion=0.01)
