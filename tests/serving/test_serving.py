"""Code the worker serves, in process: a replica's own server (``_serving``) with each kind of
entrypoint, what a handler reads and may return, streaming, cancellation by a hang-up or a
deadline, the replica's own limit on handlers at once, and ASGI applications with their
lifespan. The same server on real workers and through the ingress:
tests/daemon/test_serving_daemon.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from controller._http.limits import ConnectionLimits
from controller._ports.context import ReplicaContext, set_task_context
from controller._serving.entry import Entry, EntrypointError, build
from controller._serving.places import Places
from controller._serving.server import ReplicaServer

from ..http_client import Conn, raw, request

HERE = Path(__file__).parent.parent
LIMIT_S = 30


def entry(name: str, **kwargs: Any) -> Entry:
    return build(
        {
            "entrypoint": f"serving_apps:{name}",
            "init_args": [],
            "init_kwargs": kwargs,
            "pythonpath": [str(HERE)],
        }
    )


@asynccontextmanager
async def served(
    name: str, *, max_ongoing: int = 100, timeout_s: float = 60.0, **kwargs: Any
) -> AsyncIterator[ReplicaServer]:
    """The replica server of `name` on a free loopback port; drained at the end."""
    set_task_context(ReplicaContext(f"{name}#1", name, "v1", 0))  # this test's task's
    server = ReplicaServer(
        entry(name, **kwargs), max_ongoing_requests=max_ongoing, request_timeout_s=timeout_s
    )
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run, "127.0.0.1", 0)
            yield server
            await server.drain()


# -- what an entrypoint names --


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("hello", "function"),
        ("describe", "function"),
        ("no_request", "function"),
        ("with_default", "function"),
        ("tokens", "function"),
        ("Scaled", "callable"),
        ("Counting", "callable"),
        ("api", "asgi"),
        ("raw_asgi", "asgi"),
        ("AppClass", "asgi"),
    ],
)
def test_what_an_entrypoint_names_decides_how_it_is_served(name: str, kind: str) -> None:
    built = entry(name)
    assert built.kind == kind
    assert built.served
    # A class's instance is what the contract's methods are found on; a function has none.
    assert (built.instance is not None) == (name[0].isupper())


def test_a_class_that_serves_itself_is_left_to_serve_as_before() -> None:
    built = build({"entrypoint": "replicas:Trivial", "init_args": [], "pythonpath": [str(HERE)]})
    assert (built.kind, built.served, built.target) == ("replica", False, None)


@pytest.mark.parametrize(
    ("name", "kwargs", "says"),
    [
        ("NOT_CALLABLE", {}, "type int, which cannot be called: name a function, a class"),
        ("two_args", {}, "needs 2 arguments"),
        ("keyword_only", {}, "needs keyword-only arguments (request)"),
        ("sync_asgi", {}, "is not async"),
        ("hello", {"x": 1}, "init_args and init_kwargs are for a class"),
    ],
)
def test_an_entrypoint_that_cannot_be_served_says_why(
    name: str, kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(EntrypointError, match=re.escape(says)):
        entry(name, **kwargs)


# -- requests and answers --


async def test_a_function_answers_each_request() -> None:
    async with served("hello") as server:
        answer = await request(server.port, "/any/path?name=bob")
        assert (answer.status, answer.body) == (200, b"hello, bob\n")
        assert answer.headers["content-type"] == "text/plain; charset=utf-8"
        async with served("no_request") as other:
            assert (await request(other.port, "/")).body == b"nothing asked"
        assert server.served == 1
        assert server.load == 0


async def test_a_handler_reads_the_request_as_a_starlette_user_would() -> None:
    async with served("describe", timeout_s=30) as server:
        answer = await request(
            server.port,
            "/under/some%20where?a=1&b=2&b=3&e=",
            method="POST",
            body=b"payload",
            headers=[
                ("X-Thing", "it"),
                ("x-many", "1"),
                ("X-Many", "2"),
                ("Cookie", 'k=v; q="quoted"'),
                ("x-forwarded-prefix", "/under"),
            ],
        )
        seen = answer.json()
        assert seen["method"] == "POST"
        assert (seen["path"], seen["raw_path"]) == ("/under/some where", "/under/some%20where")
        assert seen["query"] == [["a", "1"], ["b", "2"], ["b", "3"], ["e", ""]]
        assert seen["b"] == ["2", "3"]
        assert (seen["header"], seen["headers"]) == ("it", ["1", "2"])
        assert seen["cookies"] == {"k": "v", "q": "quoted"}
        assert seen["body"] == "payload"
        assert seen["root_path"] == "/under"
        assert 0 < seen["time_left"] <= 30
        assert seen["url"] == "http://test/under/some%20where?a=1&b=2&b=3&e="
        # A caller that has less time says so, and the handler sees it.
        answer = await request(server.port, "/", headers=[("x-request-timeout-ms", "1500")])
        assert 0 < answer.json()["time_left"] <= 1.5


async def test_bodies_whole_as_json_and_streamed() -> None:
    async with served("sync_body") as server:
        # A sync handler runs in a thread of the replica's pool, called with its body read.
        answer = await request(server.port, "/", method="POST", body=b"x" * 300_000)
        assert answer.json()["length"] == 300_000
        assert answer.json()["thread"] != "MainThread"
        chunked = await request(server.port, "/", method="POST", body=_pieces(b"y" * 1000, 7))
        assert chunked.json()["length"] == 7000
    async with served("json_body") as server:
        answer = await request(server.port, "/", method="POST", body=b'{"a": [1, 2]}')
        assert answer.json() == {"got": {"a": [1, 2]}}
        bad = await request(server.port, "/", method="POST", body=b"{nope")
        assert bad.status == 500  # the handler's own error: its traceback in the log
    async with served("streamed_body") as server:
        answer = await request(server.port, "/", method="POST", body=_pieces(b"z" * 4096, 50))
        assert answer.json()["bytes"] == 50 * 4096
        assert answer.json()["pieces"] >= 2  # as it arrived, not whole


async def _pieces(piece: bytes, count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield piece
        await trio.lowlevel.checkpoint()


@pytest.mark.parametrize(
    ("kind", "status", "content_type", "body"),
    [
        ("str", 200, "text/plain; charset=utf-8", b"text"),
        ("bytes", 200, "application/octet-stream", b"\x00\x01"),
        ("dict", 200, "application/json", b'{"a":1}'),
        ("list", 200, "application/json", b"[1,2]"),
        ("int", 200, "application/json", b"7"),
        ("none", 200, None, b""),
        ("response", 201, "application/json", b'{"made":true}'),
        ("media", 200, "text/html", b"<b>hi</b>"),
    ],
)
async def test_what_a_handler_returns_becomes_its_answer(
    kind: str, status: int, content_type: str | None, body: bytes
) -> None:
    async with served("shapes") as server:
        answer = await request(server.port, f"/?kind={kind}")
        assert (answer.status, answer.body) == (status, body)
        assert answer.headers.get("content-type") == content_type
        assert answer.headers["content-length"] == str(len(body))
        if kind == "response":
            assert answer.headers["x-made"] == "yes"


@pytest.mark.parametrize("kind", ["bad", "bad_header", "nan"])
async def test_what_cannot_be_an_answer_is_a_500_and_a_line_in_the_log(
    kind: str, capfd: pytest.CaptureFixture[str]
) -> None:
    async with served("shapes") as server:
        answer = await request(server.port, f"/?kind={kind}")
        assert answer.status == 500
        assert b"Traceback" not in answer.body  # said in the replica's log, not to the client
        # The connection goes on: the next request is served.
        assert (await request(server.port, "/?kind=str")).status == 200
    err = capfd.readouterr().err
    assert f"GET /?kind={kind} failed" in err


async def test_a_handlers_own_framing_headers_are_the_servers() -> None:
    async with served("shapes") as server:
        answer = await raw(
            server.port, b"GET /?kind=framing HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
        )
        assert b"content-length: 1\r\n" in answer
        assert b"99" not in answer
        assert b"x-ok: 1" in answer


async def test_a_handler_that_raises_answers_500_with_its_traceback_in_the_log(
    capfd: pytest.CaptureFixture[str],
) -> None:
    async with served("boom") as server:
        answer = await request(server.port, "/x")
        assert answer.status == 500
        assert answer.json()["error"]["type"] == "HandlerError"
        assert b"a failure of the user's own" not in answer.body
        assert server.failed == 1
    err = capfd.readouterr().err
    assert "GET /x failed" in err
    assert "ValueError: a failure of the user's own" in err
    assert "serving_apps.py" in err


# -- streaming --


async def test_a_generator_is_streamed_as_it_yields() -> None:
    async with served("tokens") as server:
        conn = await Conn.open(server.port)
        async with conn.stream:
            began = trio.current_time()
            await conn.stream.send_all(b"GET /?n=4&delay=0.3 HTTP/1.1\r\nHost: h\r\n\r\n")
            first = await conn.stream.receive_some(65536)
            # The head and the first token arrive long before the last is made.
            assert b"transfer-encoding: chunked" in first
            got = first
            while b"token0" not in got:
                got += await conn.stream.receive_some(65536)
            first_at = trio.current_time() - began
            while not got.endswith(b"0\r\n\r\n"):
                got += await conn.stream.receive_some(65536)
            whole_at = trio.current_time() - began
            assert whole_at >= 1.2
            assert first_at < whole_at - 0.6  # three more tokens came after it, 0.3 s apart
        answer = await request(server.port, "/?n=3&delay=0")
        assert answer.body == b"token0 token1 token2 "
    async with served("sync_tokens") as server:
        answer = await request(server.port, "/")
        assert answer.body == b'{"n":0}\n{"n":1}\n{"n":2}\n'


async def test_a_stream_that_breaks_is_cut_short_for_the_client(
    capfd: pytest.CaptureFixture[str],
) -> None:
    async with served("broken_stream") as server:
        answer = await raw(server.port, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert b"first " in answer
        assert not answer.endswith(b"0\r\n\r\n")  # never ended: the client sees it broken
        again = await raw(server.port, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert again.startswith(b"HTTP/1.1 200 ")  # the server goes on
    assert "RuntimeError: broke mid-stream" in capfd.readouterr().err


async def test_head_requests_get_the_head_alone() -> None:
    async with served("hello") as server:
        answer = await raw(server.port, b"HEAD / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert b"content-length: 13\r\n" in answer  # of "hello, world\n", which is not sent
        assert answer.endswith(b"\r\n\r\n")


# -- cancellation, deadlines and limits --


async def test_a_client_that_hangs_up_cancels_its_handler_at_once() -> None:
    async with served("Counting") as server:
        app = server.entry.target
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"GET /sleep?s=10 HTTP/1.1\r\nHost: h\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert app.inside == 1
        hung_up = trio.current_time()
        sock.close()
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert app.cancelled == 1
        # Far under the 10 s it would have run (the figure itself is the benchmark's).
        assert trio.current_time() - hung_up < 5
        assert (app.inside, server.load) == (0, 0)


async def test_past_its_deadline_a_handler_is_cancelled_and_the_client_gets_504() -> None:
    async with served("Counting", timeout_s=0.3) as server:
        app = server.entry.target
        began = trio.current_time()
        answer = await request(server.port, "/sleep?s=10")
        assert answer.status == 504
        assert answer.json()["error"]["type"] == "GatewayTimeout"
        assert 0.3 <= trio.current_time() - began < 5
        assert app.cancelled == 1
        assert server.load == 0
        # A caller that has less time left than the backend's deadline is held to it.
        answer = await request(server.port, "/sleep?s=10", headers=[("x-request-timeout-ms", "50")])
        assert answer.status == 504
        assert app.cancelled == 2
        # The slot is given back: the next request is served.
        assert (await request(server.port, "/quick")).status == 200


async def test_no_more_than_max_ongoing_requests_run_at_once() -> None:
    async with served("Counting", max_ongoing=10) as server:
        app = server.entry.target
        statuses: list[int] = []

        async def one() -> None:
            statuses.append((await request(server.port, "/sleep?s=0.05")).status)

        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(one)
        assert statuses == [200] * 200
        assert app.most == 10  # full, and never more: the rest waited their turn
        assert (server.load, server.served) == (0, 200)


async def test_a_blocking_sync_handler_holds_a_thread_not_the_server() -> None:
    async with served("Blocking", max_ongoing=4) as server, trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(request, server.port, "/?s=2")
        await _until(lambda: server.in_flight == 4)
        # Four threads blocked; the server still reads and queues the next request.
        conn = await Conn.open(server.port)
        nursery.start_soon(conn.request, "/?s=0")
        await _until(lambda: server.waiting == 1)
        assert server.in_flight == 4
        nursery.cancel_scope.cancel()
        await conn.aclose()


async def _until(condition: Callable[[], bool]) -> None:
    """Wait for `condition`, looked at every 10 ms: real threads and sockets, which no event of
    the test's says are done. Bounded for a machine at load 20: progress, not speed."""
    with trio.fail_after(30):
        while not condition():  # noqa: ASYNC110 (no event to wait on: see above)
            await trio.sleep(0.01)


# -- ASGI --


async def test_an_asgi_app_answers_with_path_parameters_json_and_errors() -> None:
    async with served("api") as server:
        assert (await request(server.port, "/items/3?q=z")).json() == {"item_id": 3, "q": "z"}
        missing = await request(server.port, "/items/0")
        assert (missing.status, missing.json()) == (404, {"detail": "no item 0"})
        invalid = await request(server.port, "/items/x")
        assert invalid.status == 422
        made = await request(
            server.port,
            "/items",
            method="POST",
            body=json.dumps({"name": "fig", "price": 2.5}).encode(),
            headers=[("content-type", "application/json")],
        )
        assert made.json() == {"name": "fig", "price": 2.5, "taxed": 3.0}
        failed = await request(server.port, "/fail")
        assert failed.status == 500
        # Routed under a prefix, its routes are relative to it (Starlette's root path).
        under = await request(server.port, "/api/where", headers=[("x-forwarded-prefix", "/api")])
        assert under.json() == {"path": "/api/where", "root_path": "/api"}


async def test_an_asgi_apps_lifespan_starts_before_it_serves() -> None:
    async with served("with_lifespan") as server:
        assert (await request(server.port, "/state")).json() == {"started": os.getpid()}
    async with served("raw_asgi") as server:  # no lifespan: served without it
        answer = await request(server.port, "/p")
        assert (answer.status, answer.body, answer.headers["x-raw"]) == (200, b"/p!", "1")
    async with served("AppClass", greeting="hello") as server:
        assert (await request(server.port, "/greet")).json() == {"greeting": "hello"}


async def test_an_asgi_app_whose_startup_fails_does_not_serve() -> None:
    server = ReplicaServer(entry("failing_startup"))
    with (
        trio.fail_after(LIMIT_S),
        pytest.RaisesGroup(
            pytest.RaisesExc(RuntimeError, match="startup failed"), flatten_subgroups=True
        ),
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run, "127.0.0.1", 0)


# -- draining --


async def test_a_drain_ends_the_requests_under_way_then_stops_listening() -> None:
    set_task_context(ReplicaContext("Counting#1", "Counting", "v1", 0))
    server = ReplicaServer(entry("Counting"))
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run, "127.0.0.1", 0)
            port = server.port
            answers: list[int] = []

            async def slow() -> None:
                answers.append((await request(port, "/sleep?s=0.5")).status)

            nursery.start_soon(slow)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert server.in_flight == 1
            began = trio.current_time()
            await server.drain()
            drained_at = trio.current_time() - began
            assert answers == [200]  # the request under way ended first
            assert drained_at >= 0.4
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_limits_reach_the_server() -> None:
    limits = ConnectionLimits(max_connections_per_client=5)
    server = ReplicaServer(entry("hello"), limits=limits)
    assert server._server.limits is limits
    assert sys.modules["serving_apps"].__file__ is not None


async def test_places_let_in_first_come_first_served_each_by_its_own_limit() -> None:
    places = Places()
    order: list[int] = []
    scopes: dict[int, trio.CancelScope] = {}

    async def one(n: int, limit: int, leave: trio.Event) -> None:
        with trio.CancelScope() as scopes[n]:
            await places.take(limit)
            order.append(n)
            await leave.wait()
            places.give_back()

    leaves = [trio.Event() for _ in range(5)]
    async with trio.open_nursery() as nursery:
        for n in range(4):
            nursery.start_soon(one, n, 2, leaves[n])
            await trio.testing.wait_all_tasks_blocked()
        assert (order, places.taken, places.waiting) == ([0, 1], 2, 2)
        # One whose router says the limit is 4 waits behind those already in line.
        nursery.start_soon(one, 4, 4, leaves[4])
        await trio.testing.wait_all_tasks_blocked()
        assert (order, places.waiting) == ([0, 1], 3)
        leaves[0].set()
        await trio.testing.wait_all_tasks_blocked()
        assert (order, places.taken) == ([0, 1, 2], 2)
        # One in line cancelled leaves it, and lets in those behind it that may come in.
        scopes[3].cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert (order, places.taken, places.waiting) == ([0, 1, 2, 4], 3, 0)
        for leave in leaves:
            leave.set()
    assert (places.taken, places.waiting, order) == (0, 0, [0, 1, 2, 4])


@pytest.mark.parametrize("name", ["exits", "interrupts"])
async def test_a_handler_that_exits_fails_its_request_not_its_replica(
    name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    async with served(name) as server:
        for _ in range(3):
            assert (await request(server.port, "/")).status == 500
        assert server.failed == 3
    assert "HandlerEscaped" in capfd.readouterr().err


@pytest.mark.slow
async def test_a_fastapi_app_answers_as_it_does_under_uvicorn() -> None:
    """The same requests to the same FastAPI app, served by uvicorn and by a replica's server:
    the same statuses, content types and bodies (path parameters, JSON bodies, errors)."""
    asks: list[tuple[str, str, bytes | None]] = [
        ("GET", "/items/3?q=z", None),
        ("GET", "/items/3", None),
        ("GET", "/items/0", None),
        ("GET", "/items/x", None),
        ("POST", "/items", b'{"name": "fig", "price": 2.5}'),
        ("POST", "/items", b'{"name": "fig"}'),
        ("POST", "/items", b'{"price": 2.5}'),
        ("POST", "/items", b"{not json"),
        ("POST", "/items", None),  # no body at all: 422, at once
        ("GET", "/fail", None),
        ("GET", "/nope", None),
        ("DELETE", "/items/3", None),
    ]
    # Bound and listening here, handed to uvicorn: connectable before it starts (no wait).
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    uvicorn = await trio.lowlevel.open_process(
        [
            *(sys.executable, "-m", "uvicorn", "serving_apps:api"),
            *("--fd", str(listener.fileno()), "--log-level", "critical"),
        ],
        cwd=str(HERE),
        pass_fds=(listener.fileno(),),
    )
    listener.close()
    try:
        async with served("api") as ours:
            for method, path, body in asks:
                headers = [("content-type", "application/json")] if body else []
                theirs = await request(port, path, method=method, body=body, headers=headers)
                mine = await request(ours.port, path, method=method, body=body, headers=headers)
                assert (mine.status, mine.headers.get("content-type"), mine.body) == (
                    theirs.status,
                    theirs.headers.get("content-type"),
                    theirs.body,
                ), (method, path)
    finally:
        uvicorn.terminate()
        await uvicorn.wait()


@pytest.mark.parametrize("name", ["describe", "sync_body", "api"])
async def test_a_body_that_breaks_its_framing_is_answered_400_and_closed(name: str) -> None:
    async with served(name) as server:
        head = b"POST /items HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        for body in (b"zz\r\nhello\r\n0\r\n\r\n", b"3\r\nhello\r\n0\r\n\r\n"):
            answer = await raw(server.port, head + body)
            assert answer.startswith(b"HTTP/1.1 400 "), answer
            assert b"connection: close" in answer
        assert server.load == 0
        assert server.failed == 0  # the client's fault, not the handler's


async def test_an_asgi_app_hears_the_end_of_a_request_without_a_body() -> None:
    async with served("reads_then_answers") as server:
        with trio.fail_after(5):
            assert (await request(server.port, "/")).body == b"0"
            empty = await request(server.port, "/", method="POST", body=b"")
            assert empty.body == b"0"
            assert (await request(server.port, "/", method="POST", body=b"abc")).body == b"3"
            old = await raw(server.port, b"GET / HTTP/1.0\r\n\r\n")
            assert old.endswith(b"\r\n\r\n0")


async def test_no_body_goes_with_a_204_or_a_304_and_the_next_answer_is_read_right() -> None:
    async with served("statuses") as server:
        for code in (204, 304):
            answer = await raw(
                server.port,
                f"GET /?code={code} HTTP/1.1\r\nHost: h\r\n\r\n".encode()
                + b"GET /?code=200 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            )
            first, _, rest = answer.partition(b"\r\n\r\n")
            assert first.startswith(f"HTTP/1.1 {code} ".encode())
            assert (b"content-length" in first.lower()) == (code == 304)
            assert rest.startswith(b"HTTP/1.1 200 "), rest  # no stray body before it
            assert rest.endswith(b"\r\n\r\nbody!")
        # A name given twice is sent twice.
        answer = await raw(server.port, b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        assert b"set-cookie: a=1\r\nset-cookie: b=2\r\n" in answer
    async with served("no_content_asgi") as server:
        answer = await raw(server.port, b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 204 ")
        assert answer.endswith(b"\r\n\r\n")  # its body dropped


async def test_what_a_request_says_of_the_limit_decides_its_own_admission_only() -> None:
    async with served("Counting", max_ongoing=2) as server:
        app = server.entry.target

        async def sleep(limit: int | None, statuses: list[int]) -> None:
            headers = [] if limit is None else [("x-max-ongoing-requests", str(limit))]
            answer = await request(server.port, "/sleep?s=0.2", headers=headers)
            statuses.append(answer.status)

        # A direct client claiming 1 throttles no one else: the others still run 2 at once.
        statuses: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sleep, 1, statuses)
            for _ in range(4):
                nursery.start_soon(sleep, None, statuses)
        assert statuses == [200] * 5
        assert app.most == 2
        # Claiming 10 lets in its own requests, not the others' past their limit.
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(sleep, 10, statuses)
        assert app.most == 4


async def test_a_replica_whose_handler_threads_are_all_stuck_says_so(
    capfd: pytest.CaptureFixture[str],
) -> None:
    release = sys.modules["serving_apps"].RELEASE  # as the replica imported it
    try:
        async with served("stuck", max_ongoing=2, timeout_s=0.2) as server:
            for _ in range(2):
                assert (await request(server.port, "/")).status == 504
            # Both threads still run calls whose requests ended: it cannot serve, and says so
            # (its health check fails, and it is replaced), holding that load meanwhile.
            problem = server.problem()
            assert problem is not None
            assert "threads are all held" in problem
            assert server.load == 2
            assert (await request(server.port, "/")).status == 504
            release.set()
            with trio.fail_after(5):
                while server.problem() is not None:
                    await server.next_change().wait()
    finally:
        release.set()
