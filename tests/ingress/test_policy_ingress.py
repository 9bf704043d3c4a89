"""A backend's request policies through a real ingress, against replicas on real sockets that
answer, or take a request and die with it: session affinity keeps a key on its replica and
moves only the keys a new replica takes; a POST that reached a replica is never sent again,
a GET is; a failing backend sees retries within the budget, not a multiple of its traffic; a
rate limit answers 429 with Retry-After, per client or per key; and the ingress's metrics
count each. The decisions alone, under MockClock: tests/serving/test_policy.py."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
import trio.testing

import controller
from controller._model.views.status import LoadReport
from controller._routing.table import RouteInfo
from controller.ingress import Ingress, open_listener

from ..http_client import request

LIMIT_S = 60


@attrs.define
class Source:
    """A watch source the test sets: one backend, ``app`` at ``/app``."""

    send: trio.MemorySendChannel[RouteInfo]
    receive: trio.MemoryReceiveChannel[RouteInfo]
    snapshot: int = 0

    @classmethod
    def new(cls) -> Source:
        send, receive = trio.open_memory_channel[RouteInfo](10)
        return cls(send, receive)

    def describe(self) -> str:
        return "the test"

    async def changes(self) -> tuple[list[RouteInfo], bool]:
        return [await self.receive.receive()], True

    async def report(self, reports: list[LoadReport]) -> None:
        pass

    async def set(self, replicas: list[Any], **policies: Any) -> None:
        self.snapshot += 1
        given = tuple((f"app#{r.port}", f"127.0.0.1:{r.port}") for r in replicas)
        await self.send.send(
            RouteInfo("app", self.snapshot, True, False, "/app", 100, 1000, given, **policies)
        )


@attrs.define(eq=False)
class Changes:
    """Wakes whoever waits for a state of the replicas or clients, as each change happens."""

    _event: trio.Event = attrs.field(factory=trio.Event)

    def notify(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._event.wait()


CHANGES = Changes()


@attrs.define(eq=False)
class Replica:
    """An HTTP replica on a real socket. It answers each request with its port, or (`dies`)
    reads it whole, holds it until the test opens the gate, and closes unanswered."""

    dies: bool = False
    port: int = 0
    received: int = 0
    held: int = 0
    closed: int = 0
    gate: trio.Event = attrs.field(factory=trio.Event)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._one, listeners)

    def open_gate(self) -> None:
        self.gate.set()
        self.gate = trio.Event()

    async def _one(self, stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    more = await stream.receive_some(65536)
                    if not more:
                        return
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(data) < length:
                    data += await stream.receive_some(65536)
                data = data[length:]
                self.received += 1
                if self.dies:
                    self.held += 1
                    CHANGES.notify()
                    await self.gate.wait()
                    self.held -= 1
                    self.closed += 1
                    CHANGES.notify()
                    return  # closed without a word
                body = b"%d" % self.port
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
                )


@asynccontextmanager
async def ingress_with(
    replicas: list[Replica], **policies: Any
) -> AsyncIterator[tuple[int, Source, Ingress, trio.Nursery]]:
    source = Source.new()
    async with trio.open_nursery() as nursery:
        for replica in replicas:
            await nursery.start(replica.serve)
        await source.set(replicas, **policies)
        ingress = Ingress(source)
        await nursery.start(ingress.run)
        listener = await open_listener("127.0.0.1", 0)
        await nursery.start(ingress.serve, [listener])
        yield listener.socket.getsockname()[1], source, ingress, nursery
        nursery.cancel_scope.cancel()


def counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}_total{{backend="app"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def policy(**fields: Any) -> dict[str, Any]:
    """The policy blocks as a backend's config makes them (validated)."""
    config = controller.BackendConfig(**fields)
    return {name: getattr(config, name) for name in fields}


async def test_a_session_stays_on_its_replica_and_a_new_replica_takes_only_keys_it_owns() -> None:
    replicas = [Replica() for _ in range(3)]
    with trio.fail_after(LIMIT_S):
        async with ingress_with(replicas, **policy(affinity={"header": "X-User"})) as (
            port,
            source,
            ingress,
            nursery,
        ):
            users = [f"user-{i}" for i in range(60)]
            homes: dict[str, bytes] = {}
            for _ in range(3):
                for user in users:
                    answer = await request(port, "/app/x", headers=[("X-User", user)])
                    assert answer.status == 200
                    assert homes.setdefault(user, answer.body) == answer.body
            assert len(set(homes.values())) == 3  # the keys spread over all three
            newcomer = Replica()
            await nursery.start(newcomer.serve)
            await source.set([*replicas, newcomer], **policy(affinity={"header": "X-User"}))
            await trio.testing.wait_all_tasks_blocked()  # the ingress took the snapshot
            backend = ingress.backend("app")
            assert backend is not None
            assert len(backend.slots) == 4
            moved = 0
            for user in users:
                answer = await request(port, "/app/x", headers=[("X-User", user)])
                if answer.body != homes[user]:
                    assert answer.body == b"%d" % newcomer.port  # moved only to the new one
                    moved += 1
            assert 0 < moved <= math.ceil(len(users) / 2)
            metrics = (await request(port, "/-/metrics")).body.decode()
            assert counter(metrics, "ingress_affinity_kept") >= 3 * len(users)


async def test_a_post_that_reached_a_replica_is_never_sent_again_a_get_is() -> None:
    replicas = [Replica(dies=True) for _ in range(3)]
    for replica in replicas:
        replica.gate.set()  # each closes at once
    with trio.fail_after(LIMIT_S):
        async with ingress_with(replicas) as (port, *_):
            answer = await request(port, "/app/order", method="POST", body=b'{"n": 1}')
            assert answer.status == 502
            assert sum(r.received for r in replicas) == 1
            answer = await request(port, "/app/order")
            assert answer.status == 502
            assert b"tried every replica (3)" in answer.body
            assert sum(r.received for r in replicas) == 1 + 3
            assert all(r.received for r in replicas)
            metrics = (await request(port, "/-/metrics")).body.decode()
            assert counter(metrics, "ingress_retries") == 2


async def test_a_failing_backend_sees_retries_within_the_budget() -> None:
    """40 GETs held by replicas that then die with them: of those under way, 20 % (8) may be
    tried again at once, the rest are answered 502 at once; those retried go on to at most
    max_retries replicas, and no new budget is taken."""
    replicas = [Replica(dies=True) for _ in range(5)]
    clients = 40
    statuses: list[int] = []
    with trio.fail_after(LIMIT_S):
        async with ingress_with(replicas) as (port, *_):

            async def one() -> None:
                statuses.append((await request(port, "/app/x")).status)
                CHANGES.notify()

            async with trio.open_nursery() as nursery:
                for _ in range(clients):
                    nursery.start_soon(one)
                await CHANGES.until(lambda: sum(r.held for r in replicas) == clients)
                first = sum(r.received for r in replicas)
                for replica in replicas:
                    replica.open_gate()
                # Each request either is answered 502 or its retry arrives at a replica.
                await CHANGES.until(
                    lambda: (
                        sum(r.closed for r in replicas) == clients
                        and len(statuses) + sum(r.held for r in replicas) == clients
                    )
                )
                retried = sum(r.held for r in replicas)
                assert 3 <= retried <= clients * 20 // 100
                assert statuses == [502] * len(statuses)
                for _ in range(4):
                    for replica in replicas:
                        replica.gate.set()
            assert statuses == [502] * clients
            assert first == clients
            # Each retried request went to at most 3 other replicas; the rest to none.
            assert sum(r.received for r in replicas) <= clients + retried * 3
            metrics = (await request(port, "/-/metrics")).body.decode()
            assert counter(metrics, "ingress_retries_refused") == clients - retried


async def test_a_rate_limit_answers_429_per_client_or_per_key_and_says_when() -> None:
    replicas = [Replica()]
    limit = {"requests_per_s": 0.001, "burst": 2, "header": "X-Api-Key"}
    with trio.fail_after(LIMIT_S):
        async with ingress_with(replicas, **policy(rate_limit=limit)) as (port, *_):
            assert [(await request(port, "/app/x")).status for _ in range(2)] == [200, 200]
            refused = await request(port, "/app/x")
            assert refused.status == 429
            assert refused.headers["retry-after"] == "1000"
            assert refused.json()["error"]["type"] == "RateLimited"
            keyed = await request(port, "/app/x", headers=[("X-Api-Key", "k1")])
            assert keyed.status == 200  # a key has a bucket of its own
            assert replicas[0].received == 3
            metrics = (await request(port, "/-/metrics")).body.decode()
            assert counter(metrics, "ingress_rate_limited") == 1
