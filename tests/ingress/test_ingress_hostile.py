"""The ingress against a client that means harm, in process and fast: a replica of trio and h11
in the same run, and a watch source that lists it. Whatever a client sends, every replica slot
taken is given back (in flight and queued return to 0) and the next client is served; long
paths cost little; paths another component could read differently are refused; no client can
hold more than its share of connections.

The framing tests run against a replica's own server too (``target="replica"``: code the worker
serves, over the same HTTP/1.1), which must hold to the same rules."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from controller import Request
from controller._http.connection import CLOSING_GRACE_S
from controller._http.framing import MAX_HEADER_LINES
from controller._model.views.status import LoadReport
from controller._routing.sources import SourceError, read_answer
from controller._routing.table import RouteInfo
from controller._serving.entry import Entry
from controller._serving.server import ReplicaServer
from controller.ingress import Ingress, IngressConfig, RouteTable, open_listener

from ..http_client import Conn, raw, request

LIMIT_S = 30
#: Examples of arbitrary headers (the issue asks for 200); ten times as many in the
#: reliability session.
EXAMPLES = 200 * int(os.environ.get("RELIABILITY_SCALE", "1"))


@attrs.define
class StaticSource:
    """A watch source with one routed backend, `app` at ``/app``, on the given replicas."""

    replicas: tuple[tuple[str, str], ...]
    reports: list[LoadReport] = attrs.field(factory=list)
    _given: bool = False

    def describe(self) -> str:
        return "a static list"

    async def changes(self) -> tuple[list[RouteInfo], bool]:
        if self._given:
            await trio.sleep_forever()
        self._given = True
        info = RouteInfo("app", 1, True, False, "/app", 100, 1000, self.replicas)
        return [info], True

    async def report(self, reports: list[LoadReport]) -> None:
        self.reports.extend(reports)


@attrs.define
class Replica:
    """An HTTP replica that answers every request with what it saw: its path and headers."""

    port: int = 0
    seen: list[dict[str, Any]] = attrs.field(factory=list)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._one, listeners)

    async def _one(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        async with stream:
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError:
                    return  # the ingress gave up on a request mid-body: so do we
                if event is h11.NEED_DATA:
                    try:
                        data = await stream.receive_some(65536)
                    except trio.BrokenResourceError:
                        return
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    request = {
                        "path": event.target.decode("latin-1"),
                        "headers": [(k.decode(), v.decode("latin-1")) for k, v in event.headers],
                    }
                    self.seen.append(request)
                elif isinstance(event, h11.EndOfMessage):
                    body = json.dumps(self.seen[-1]).encode()
                    head = h11.Response(
                        status_code=200, headers=[("Content-Length", str(len(body)))]
                    )
                    try:
                        await stream.send_all(
                            conn.send(head)
                            + (conn.send(h11.Data(data=body)) or b"")
                            + (conn.send(h11.EndOfMessage()) or b"")
                        )
                    except trio.BrokenResourceError:
                        return
                    if conn.our_state is not h11.DONE:
                        return
                    conn.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    return


@attrs.define
class SeenApp:
    """The replica server's counterpart of `Replica`: code the worker serves, answering every
    request with what it saw (its target and headers), its body read first."""

    seen: list[dict[str, Any]] = attrs.field(factory=list)

    async def __call__(self, request: Request) -> dict[str, Any]:
        request_seen = {
            "path": request.target.decode("latin-1"),
            "headers": [(k.decode(), v.decode("latin-1")) for k, v in request.raw_headers],
        }
        self.seen.append(request_seen)
        await request.body()
        return request_seen


#: The servers the framing tests run against: the ingress (with a replica behind it), and a
#: replica's own server (code the worker serves).
TARGETS = ["ingress", "replica"]


@attrs.define
class Front:
    ingress: Ingress | None
    port: int
    replica: Replica | RawReplica | SeenApp
    server: ReplicaServer | None = None

    def settled(self) -> bool:
        """Nothing in flight or queued, and no connection but idle ones."""
        if self.server is not None:
            return self.server.load == 0
        assert self.ingress is not None
        load = self.ingress.load()
        return all(v == (0, 0) for v in load.values())

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        else:
            assert self.ingress is not None
            self.ingress.close()

    @property
    def the_ingress(self) -> Ingress:
        assert self.ingress is not None
        return self.ingress


@attrs.define
class RawReplica:
    """A replica that misbehaves on purpose, by path, once it has read a request's head:
    ``/extra`` answers, then sends bytes past its answer in the same write; ``/extra2`` sends
    its head, then the body and the stray bytes in a second write; ``/early`` answers 413 and
    closes without reading the body."""

    port: int = 0
    seen: list[dict[str, Any]] = attrs.field(factory=list)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._one, listeners)

    async def _one(self, stream: trio.SocketStream) -> None:
        async with stream:
            head = bytearray()
            while b"\r\n\r\n" not in head:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                head += chunk
            path = head.split(b" ", 2)[1]
            self.seen.append({"path": path.decode()})
            answer = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"
            stray = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n"
            if path == b"/app/extra":
                await stream.send_all(answer + stray)
            elif path == b"/app/extra2":
                await stream.send_all(answer[:-5])
                await trio.sleep(0.05)  # apart: a second read at the ingress
                await stream.send_all(b"hello" + stray)
            elif path == b"/app/early":
                await stream.send_all(
                    b"HTTP/1.1 413 Too Large\r\ncontent-length: 4\r\nconnection: close\r\n\r\nbig!"
                )
            with trio.move_on_after(1):
                while await stream.receive_some(65536):
                    if path == b"/app/early":
                        break  # it reads no more, and closes


@asynccontextmanager
async def front(
    config: IngressConfig | None = None,
    replica: Replica | RawReplica | None = None,
    target: str = "ingress",
) -> AsyncIterator[Front]:
    if target == "replica":
        async with trio.open_nursery() as nursery:
            app = SeenApp()
            server = ReplicaServer(Entry("callable", app, app), limits=config or IngressConfig())
            await nursery.start(server.run, "127.0.0.1", 0)
            yield Front(None, server.port, app, server)
            nursery.cancel_scope.cancel()
        return
    async with trio.open_nursery() as nursery:
        replica = replica if replica is not None else Replica()
        await nursery.start(replica.serve)
        source = StaticSource((("app#1", f"127.0.0.1:{replica.port}"),))
        ingress = Ingress(source, config or IngressConfig())
        await nursery.start(ingress.run)
        listener = await open_listener("127.0.0.1", 0)
        await nursery.start(ingress.serve, [listener])
        yield Front(ingress, listener.socket.getsockname()[1], replica)
        nursery.cancel_scope.cancel()


# Header names: tokens, and what is not one. Values: any byte but CR and LF (which end the
# line, and are the framing's business), including NUL, DEL, bytes past ASCII, trailing ';'
# and spaces, and the framing headers themselves.
_NAMES = st.one_of(
    st.sampled_from(
        [
            b"Cookie",
            b"Content-Length",
            b"Transfer-Encoding",
            b"Connection",
            b"Host",
            b"Expect",
            b"Upgrade",
            b"X-Forwarded-For",
            b"Te",
            b"Keep-Alive",
            b"X-A",
        ]
    ),
    st.binary(min_size=0, max_size=20).filter(lambda b: b"\r" not in b and b"\n" not in b),
)
_VALUES = st.binary(max_size=60).filter(lambda b: b"\r" not in b and b"\n" not in b)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(headers=st.lists(st.tuples(_NAMES, _VALUES), max_size=8))
@example(headers=[(b"Cookie", b"theme=dark;")])
@example(headers=[(b"Cookie", b"controller_session_7070=x; theme=dark; ")])
@example(headers=[(b"Content-Length", b"5"), (b"Transfer-Encoding", b"chunked")])
@example(headers=[(b"Connection", b"close, Content-Length, Host"), (b"Content-Length", b"0")])
@example(headers=[(b"Expect", b"100-continue"), (b"Content-Length", b"3")])
@example(headers=[(b"X-A", b"\x00\x7f\xff"), (b"Transfer-Encoding", b"gzip, chunked")])
@pytest.mark.parametrize("target", TARGETS)
async def test_whatever_headers_a_client_sends_every_slot_is_given_back(
    target: str, headers: list[tuple[bytes, bytes]]
) -> None:
    with trio.fail_after(LIMIT_S):
        config = IngressConfig(body_timeout_s=0.2, header_timeout_s=0.5)
        async with front(config, target=target) as f:
            head = b"GET /app/x HTTP/1.1\r\nHost: h\r\n"
            head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
            status = await _one_answer(f.port, head + b"\r\n")
            assert status is None or 200 <= status < 600
            # Once every task waits, the ingress is done with the request (its slot given
            # back in the finally that follows the answer).
            await trio.testing.wait_all_tasks_blocked(cushion=0.01)
            assert f.settled()
            assert (await request(f.port, "/app/next")).status == 200
            assert f.settled()


async def _one_answer(port: int, data: bytes) -> int | None:
    """Send `data`; the status of the one answer it gets, or None if the connection closes
    first (the ingress is then done with it)."""
    return (await _answer_of(port, data))[0]


async def _answer_of(port: int, data: bytes) -> tuple[int | None, bytes]:
    """Send the raw request `data`; the status and body of its answer (None: closed first)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "h")]))
    conn.send(h11.EndOfMessage())
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:

        async def send() -> None:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)  # a server may answer before it has read it all
            try:
                status, body = await read_answer(stream, conn)
            except (trio.BrokenResourceError, h11.RemoteProtocolError, SourceError):
                return None, b""  # closed first
            finally:
                nursery.cancel_scope.cancel()
    return status, body


async def test_the_trailing_semicolon_cookie_is_served_and_holds_nothing() -> None:
    """The cookie that used to hold a slot for ever: 100 of them, then the load is 0."""
    async with front() as f:
        ask = b"GET /app/ HTTP/1.1\r\nHost: h\r\nCookie: theme=dark;\r\n\r\n"
        for _ in range(100):
            status, body = await _answer_of(f.port, ask)
            assert status == 200
            assert ["cookie", "theme=dark;"] in json.loads(body)["headers"]
        await trio.testing.wait_all_tasks_blocked()
        assert f.the_ingress.load() == {"app": (0, 0)}
        # The console's session cookie is dropped; the others go on, joined anew.
        status, body = await _answer_of(
            f.port,
            b"GET /app/ HTTP/1.1\r\nHost: h\r\nCookie: controller_session_7070=s; theme=dark; "
            b"\r\n\r\n",
        )
        assert ["cookie", "theme=dark"] in json.loads(body)["headers"]


@pytest.mark.parametrize("target", TARGETS)
async def test_long_targets_are_refused_at_once_and_cost_little(target: str) -> None:
    async with front(target=target) as f:
        # A 1 MB request line: 414 before it has all arrived, and the connection closed.
        huge = b"GET /app/" + b"a" * (1 << 20) + b" HTTP/1.1\r\nHost: h\r\n\r\n"
        answer = await raw(f.port, huge)
        assert answer.startswith(b"HTTP/1.1 414 "), answer[:100]
        # A 60 KB path, as a flood would send it: refused for a few microseconds of work.
        long_path = b"/app/" + b"a/" * 30_000
        cpu = time.process_time()
        answer = await raw(f.port, b"GET " + long_path + b" HTTP/1.1\r\nHost: h\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 414 ")
        assert time.process_time() - cpu < 0.005  # the client's side included
        # Right at the limit, it is routed: 8 KiB of target.
        fits = "/app/" + "b" * (8192 - 5)
        assert (await request(f.port, fits)).status == 200
        assert (await request(f.port, fits + "b")).status == 414
        if target == "replica":
            return  # it routes nothing
        # Routing cost grows with the routes' depths, not with the path's length or depth.
        table, _ = RouteTable.build([("/app", "app"), ("/a/b/c", "abc"), ("/", "root")])
        deep = "/a/b/c/" + "x/" * 30_000
        cpu = time.process_time()
        for _ in range(100):
            assert table.match(deep) == "abc"
        assert (time.process_time() - cpu) / 100 < 0.0005


@pytest.mark.parametrize(
    "path",
    [
        "/app/../admin",
        "/app/./x",
        "/app/%2e%2e/admin",
        "/app/%2E./x",
        "/app/a%2fb",
        "/app/a%5Cb",
        "/app/a\\b",
        "/app/..",
        "/app/.",
        "/app/..;/admin",
        "/app/..%3B/admin",
        "/app/.;x/y",
    ],
)
@pytest.mark.parametrize("target", TARGETS)
async def test_paths_another_component_could_read_otherwise_are_refused(
    path: str, target: str
) -> None:
    async with front(target=target) as f:
        answer = await raw(f.port, f"GET {path} HTTP/1.1\r\nHost: h\r\n\r\n".encode("latin-1"))
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert b'"BadPath"' in answer
        assert f.replica.seen == []


@pytest.mark.parametrize("target", TARGETS)
async def test_the_replica_sees_the_path_routed_on(target: str) -> None:
    async with front(target=target) as f:
        for path in ("/app", "/app/", "/app//x", "/app/x?a=/../b", "/app/x%20y", "/app/...x"):
            answer = await request(f.port, path)
            assert answer.status == 200, path
            assert answer.json()["path"] == path


@pytest.mark.parametrize("target", TARGETS)
async def test_one_address_holds_at_most_its_share_of_connections(target: str) -> None:
    async with front(IngressConfig(max_connections_per_client=3), target=target) as f:
        held = [await Conn.open(f.port) for _ in range(3)]
        for conn in held:
            assert (await conn.request("/app")).status == 200
        # The fourth from 127.0.0.1 is closed unserved; one from 127.0.0.2 is served.
        assert await raw(f.port, b"GET /app HTTP/1.1\r\nHost: h\r\n\r\n") == b""
        other = await _from_address("127.0.0.2", f.port)
        assert other.startswith(b"HTTP/1.1 200 ")
        if f.ingress is not None:
            assert f.ingress.metrics.refused_by == {"per_client": 1}
        await held[0].aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert (await request(f.port, "/app")).status == 200  # room again
        for conn in held[1:]:
            await conn.aclose()


async def _from_address(source: str, port: int) -> bytes:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    stream = trio.SocketStream(sock)
    async with stream:
        await stream.send_all(b"GET /app HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        answer = bytearray()
        while chunk := await stream.receive_some(65536):
            answer += chunk
    return bytes(answer)


@pytest.mark.parametrize("target", TARGETS)
async def test_a_connection_must_send_its_first_byte_within_the_head_timeout(target: str) -> None:
    config = IngressConfig(header_timeout_s=0.3, keepalive_timeout_s=30)
    async with front(config, target=target) as f:
        # Timed from before the connection: the ingress's 0.3 s count from its accept, which
        # a busy machine may make long after our connect returns.
        began = trio.current_time()
        stream = await trio.open_tcp_stream("127.0.0.1", f.port)
        async with stream:
            with trio.fail_after(5):
                assert await stream.receive_some(100) == b""  # closed, without a word
        assert trio.current_time() - began >= 0.3
        # A kept connection idle between requests gets the keep-alive timeout instead.
        conn = await Conn.open(f.port)
        assert (await conn.request("/app")).status == 200
        with trio.move_on_after(0.6):  # a bound on something that must not happen
            await conn.stream.receive_some(100)
            raise AssertionError("a kept connection was closed before its keep-alive timeout")
        assert (await conn.request("/app")).status == 200
        await conn.aclose()


@pytest.mark.parametrize("target", TARGETS)
async def test_a_request_with_both_framings_is_answered_and_closed(target: str) -> None:
    async with front(target=target) as f:
        attack = (
            b"POST /app/x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            b"GET /app/smuggled HTTP/1.1\r\nHost: h\r\n\r\n"
        )
        answer = await raw(f.port, attack)
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert b"connection: close" in answer
        assert [s["path"] for s in f.replica.seen] == []


@pytest.mark.parametrize("target", TARGETS)
async def test_a_fragment_in_the_target_is_refused(target: str) -> None:
    async with front(target=target) as f:
        for sent in (b"/app#/../admin", b"/app/x#y", b"http://h/app#/../x"):
            answer = await raw(f.port, b"GET " + sent + b" HTTP/1.1\r\nHost: h\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400 "), (sent, answer)
        assert f.replica.seen == []


@pytest.mark.parametrize("target", TARGETS)
async def test_userinfo_header_floods_and_unknown_expectations_are_refused(target: str) -> None:
    # Found by an outside attack: a target with userinfo was forwarded as `Host: u:p@x`, a head
    # of 10,000 short lines was forwarded whole, and an unknown Expect was dropped.
    async with front(target=target) as f:
        userinfo = await raw(f.port, b"GET http://u:p@h/app/x HTTP/1.1\r\nHost: h\r\n\r\n")
        assert userinfo.startswith(b"HTTP/1.1 400 "), userinfo
        lines = b"".join(b"X-%d: a\r\n" % n for n in range(10_000))
        flood = await raw(f.port, b"GET /app/x HTTP/1.1\r\nHost: h\r\n" + lines + b"\r\n")
        assert flood.startswith(b"HTTP/1.1 431 "), flood[:100]
        expect = b"POST /app/x HTTP/1.1\r\nHost: h\r\nExpect: x-magic\r\nContent-Length: 1\r\n\r\na"
        assert (await raw(f.port, expect)).startswith(b"HTTP/1.1 417 ")
        assert f.replica.seen == []
        # At the limit, and with the one expectation served, requests pass.
        # (Connection: close: `raw` reads until the server closes, and a kept-alive connection
        # would be closed only at its idle timeout, a minute later.)
        head = b"GET /app/x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n"
        at_limit = b"".join(b"X-%d: a\r\n" % n for n in range(MAX_HEADER_LINES - 2))
        fine = await raw(f.port, head + at_limit + b"\r\n")
        assert fine.startswith(b"HTTP/1.1 200 "), fine[:100]
        old = b"GET /app/y HTTP/1.0\r\nExpect: x-magic\r\n\r\n"  # HTTP/1.0 ignores Expect
        assert (await raw(f.port, old)).startswith(b"HTTP/1.1 200 ")


async def test_bytes_a_replica_sends_past_its_answer_do_not_spoil_the_answer() -> None:
    """A replica that answered, then read the rest of the request as another and answered
    that too: the first answer is passed on whole (and its connection not reused)."""
    async with front(replica=RawReplica()) as f:
        for path in ("/app/extra", "/app/extra2"):
            for _ in range(20):
                answer = await request(f.port, path)
                assert (answer.status, answer.body) == (200, b"hello"), path
        assert f.the_ingress.proxy.pool.opened == 40  # none of those connections was kept


async def test_a_chunked_body_within_the_buffer_goes_whole_and_a_larger_one_as_an_upload() -> None:
    config = IngressConfig(buffer_body_bytes=1000)
    async with front(config) as f:
        assert isinstance(f.replica, Replica)

        def chunked(n: int) -> bytes:
            # In chunks of 100, with a client's own claim to be an upload (dropped).
            chunks = b"".join(b"64\r\n" + b"z" * 100 + b"\r\n" for _ in range(n // 100))
            return (
                b"POST /app/c HTTP/1.1\r\nHost: h\r\nX-Controller-Upload: 1\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
            )

        assert (await _answer_of(f.port, chunked(600)))[0] == 200
        seen = dict(f.replica.seen[-1]["headers"])
        assert seen["content-length"] == "600"
        assert "transfer-encoding" not in seen
        assert "x-controller-upload" not in seen
        assert (await _answer_of(f.port, chunked(5000)))[0] == 200
        seen = dict(f.replica.seen[-1]["headers"])
        assert seen["transfer-encoding"] == "chunked"
        assert "content-length" not in seen
        assert seen["x-controller-upload"] == "1"
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert f.settled()


async def test_uploads_beyond_the_backend_s_budget_get_503_and_take_no_room() -> None:
    config = IngressConfig(buffer_body_bytes=1000, max_uploads=2)
    async with front(config) as f, trio.open_nursery() as nursery:
        held: list[trio.SocketStream] = []
        for _ in range(2):
            stream = await trio.open_tcp_stream("127.0.0.1", f.port)
            held.append(stream)
            await stream.send_all(
                b"POST /app/u HTTP/1.1\r\nHost: h\r\nContent-Length: 9999\r\n\r\n"
            )
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        uploads = f.the_ingress.proxy.uploads
        assert uploads.by_backend == {"app": 2}
        assert uploads.by_client == {"127.0.0.1": 2}
        status, body = await _answer_of(
            f.port, b"POST /app/u HTTP/1.1\r\nHost: h\r\nContent-Length: 9999\r\n\r\n"
        )
        assert status == 503
        assert b"max_uploads=2" in body
        # The two uploads under way are the replica's load, not its room: a request is served.
        assert (await request(f.port, "/app/x")).status == 200
        for stream in held:
            await stream.aclose()
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert uploads.by_backend == {}
        assert uploads.by_client == {}
        assert f.settled()
        nursery.cancel_scope.cancel()


async def test_an_early_answer_to_a_large_upload_is_passed_on() -> None:
    """A replica that answers 413 at once and closes without reading a 2 MB body: the client
    gets the 413 (not a 502 for the connection the replica closed under the upload)."""
    async with front(replica=RawReplica()) as f:
        for _ in range(5):
            answer = await _answer_of(
                f.port,
                b"POST /app/early HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % (2 << 20)
                + b"x" * (2 << 20),
            )
            assert answer == (413, b"big!")


async def test_an_answer_of_ours_to_an_upload_arrives_whole_not_as_a_reset() -> None:
    """A 404 for a request whose 2 MB body is still arriving: the ingress reads and drops what
    follows for a moment before it closes, so the reset that closing with unread bytes sends
    cannot overtake the answer."""
    async with front() as f:
        upload = b"POST /nope HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % (2 << 20)
        for _ in range(20):
            status, _ = await _answer_of(f.port, upload + b"x" * (2 << 20))
            assert status == 404


@pytest.mark.parametrize("target", TARGETS)
async def test_a_slow_body_is_cut_off_and_a_small_one_holds_no_slot_meanwhile(target: str) -> None:
    config = IngressConfig(min_body_rate=1000, body_rate_window_s=0.3)
    async with front(config, target=target) as f:
        # Read whole before a slot is taken; streamed (an upload, counted apart); and a body
        # that banks a fast start of 100 KB, then trickles: judged by its window, not by its
        # average since the start (which would have given it 100 s).
        for length, start in ((1000, b"x"), (1_000_000, b"x"), (1_000_000, b"x" * 100_000)):
            stream = await trio.open_tcp_stream("127.0.0.1", f.port)
            async with stream:
                # Timed from before the send: the cut comes a window after the ingress has the
                # head at the earliest, however long a busy machine takes to get there.
                began = trio.current_time()
                await stream.send_all(
                    b"POST /app/x HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n%s"
                    % (length, start)
                )
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                if f.server is not None:
                    # A replica's handler reads its own body: it holds its place meanwhile.
                    assert f.server.in_flight == 1
                else:
                    held = f.the_ingress.load()["app"][0]
                    assert held == (0 if length == 1000 else 1)
                with trio.fail_after(5):
                    while True:  # a byte every 0.1 s: 10 a second, far under 1000
                        with trio.move_on_after(0.1):
                            answer = await stream.receive_some(65536)
                            break
                        with contextlib.suppress(trio.BrokenResourceError):
                            await stream.send_all(b"x")
                assert answer.startswith(b"HTTP/1.1 408 "), answer
                assert 0.29 <= trio.current_time() - began < 3
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert f.settled()
        # A body at a fair rate goes through.
        assert (await request(f.port, "/app/x", method="POST", body=b"y" * 200_000)).status == 200


@pytest.mark.parametrize("target", TARGETS)
async def test_pipelining_is_bounded_and_a_begun_head_keeps_its_timeout(target: str) -> None:
    config = IngressConfig(header_timeout_s=0.3)
    async with front(config, target=target) as f:
        one = b"GET /app/p HTTP/1.1\r\nHost: h\r\n\r\n"
        # 50 in one go: the first 32 are served, then 400 and the connection closed.
        answer = await raw(f.port, one * 50)
        assert answer.count(b"HTTP/1.1 200 ") == 32
        assert answer.count(b"HTTP/1.1 400 ") == 1
        assert b"TooManyPipelined" in answer
        # A head begun behind a served request must arrive within the head timeout.
        began = trio.current_time()
        with trio.fail_after(5):
            answer = await raw(f.port, one + b"GET /app/p HTTP/1.1\r\n")
        assert answer.count(b"HTTP/1.1 200 ") == 1
        assert b"HTTP/1.1 408 " in answer
        assert trio.current_time() - began < 2


@pytest.mark.parametrize("target", TARGETS)
async def test_versions_and_http_1_0_framing(target: str) -> None:
    async with front(target=target) as f:
        for version in (b"HTTP/1.2", b"HTTP/2.0", b"HTTP/9.9"):
            answer = await raw(f.port, b"GET /app " + version + b"\r\nHost: h\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 505 "), (version, answer)
        # HTTP/1.0 with a chunked body: served, then the connection closed (RFC 9112 6.1);
        # and no 100 Continue for it.
        answer = await raw(
            f.port,
            b"POST /app/c HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n"
            b"Expect: 100-continue\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
            b"GET /app/second HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        )
        assert b"100 Continue" not in answer
        assert answer.count(b"HTTP/1.1 200 ") == 1


async def test_a_client_that_leaves_before_it_is_answered_is_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Requests the ingress answers itself (404, its own paths), sent by clients that read
    nothing and leave: the connections end, and nothing is logged as a failure."""
    async with front() as f:
        for path in (b"/nope", b"/-/routes"):
            stream = await trio.open_tcp_stream("127.0.0.1", f.port)
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(b"GET " + path + b" HTTP/1.1\r\nHost: h\r\n\r\n" * 100)
            await stream.aclose()
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


@pytest.mark.parametrize("target", TARGETS)
async def test_closing_answers_a_connection_just_accepted_and_closes_kept_ones(
    target: str,
) -> None:
    """A connection accepted just before the ingress closes, whose request was on its way,
    is answered (its client would not send it again on a new connection); one kept alive
    between requests is closed at once; one that sends nothing goes after the grace."""
    async with front(target=target) as f:
        kept = await Conn.open(f.port)
        assert (await kept.request("/app/a")).status == 200
        fresh = await trio.open_tcp_stream("127.0.0.1", f.port)
        silent = await trio.open_tcp_stream("127.0.0.1", f.port)
        await trio.testing.wait_all_tasks_blocked()  # both accepted, waiting for a request
        started = trio.current_time()
        f.close()
        await fresh.send_all(b"GET /app/b HTTP/1.1\r\nHost: h\r\n\r\n")
        answer = b""
        while chunk := await fresh.receive_some(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        assert b"connection: close" in answer.lower()
        assert await kept.stream.receive_some(1) == b""  # closed unasked
        assert await silent.receive_some(1) == b""
        assert trio.current_time() - started < 3 * CLOSING_GRACE_S
        for stream in (fresh, silent, kept.stream):
            await stream.aclose()


async def _until_closed(sock: socket.socket) -> bytes:
    """What a non-blocking client socket receives until the other side closes it."""
    data = b""
    while True:
        await trio.lowlevel.wait_readable(sock)
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


@pytest.mark.parametrize("target", TARGETS)
async def test_closing_answers_a_request_already_in_a_kept_connection(target: str) -> None:
    """A kept-alive connection whose next request is in its socket, unread, when the ingress
    closes: the request is answered (closing it unread would reset the connection)."""
    async with front(target=target) as f:
        plain = socket.create_connection(("127.0.0.1", f.port))
        with plain:
            plain.setblocking(False)
            plain.send(b"GET /app/a HTTP/1.1\r\nHost: h\r\n\r\n")
            await trio.testing.wait_all_tasks_blocked()  # answered; waiting for the next
            first = plain.recv(65536)
            assert first.startswith(b"HTTP/1.1 200 ")
            plain.send(b"GET /app/c HTTP/1.1\r\nHost: h\r\n\r\n")  # no checkpoint: unread
            f.close()
            answer = await _until_closed(plain)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        assert b"connection: close" in answer.lower()
