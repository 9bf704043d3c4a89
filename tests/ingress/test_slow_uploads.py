"""The fourth attack's slow uploads, on a real daemon, its ingress process and code the worker
serves: one address sends dozens of bodies at just over the minimum rate, chunked and of a
huge length, to a backend with room for two requests. None of them may take that room: another
client is served at once, and the uploads beyond the buffer are held to a budget of their own."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from ..daemons import LIMIT_S, manifest, running
from ..http_client import connect_from, request

#: Bodies a legitimate client sends whole, and the attacker's chunks: 2 KiB a second, twice the
#: default minimum rate, so the window never cuts them.
CHUNK = b"x" * 2048


@asynccontextmanager
async def _serving(state_dir: Path, name: str, entrypoint: str) -> AsyncIterator[int]:
    """A real daemon serving `entrypoint` as backend `name` at ``/name``, with room for two
    requests (``max_ongoing_requests = 2``), once it is ready; its ingress port."""
    backend = {
        "entrypoint": entrypoint,
        "route_prefix": f"/{name}",
        "num_replicas": 1,
        "version": "v1",
        "max_ongoing_requests": 2,
        "graceful_shutdown_timeout_s": 5,
    }
    file = state_dir / f"{name}.toml"
    file.write_text(manifest(**{name: backend}))
    async with running(state_dir, "--config", str(file)) as daemon:
        assert (await daemon.cli("wait", name)).returncode == 0
        yield int(daemon.ingress_url.rpartition(":")[2])


class Answers:
    """What the uploads were answered, as they come."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self._more = trio.Event()

    def add(self, answer: bytes) -> None:
        self.seen.append(answer)
        self._more.set()
        self._more = trio.Event()

    async def at_least(self, n: int) -> None:
        while len(self.seen) < n:
            await self._more.wait()


async def _trickle(port: int, head: bytes, chunked: bool, answers: Answers) -> None:
    """An attacker's upload from 127.0.0.2: its head, then 2 KiB a second until it is
    answered (the answer is kept) or cancelled."""
    async with await connect_from("127.0.0.2", port) as stream:
        await stream.send_all(head)
        while True:
            with trio.move_on_after(1):  # the attacker's pace, not a wait for anything
                answers.add(await stream.receive_some(65536))
                return
            await stream.send_all(b"800\r\n%s\r\n" % CHUNK if chunked else CHUNK)


async def test_slow_uploads_take_no_room_and_are_held_to_their_budget(state_dir: Path) -> None:
    with trio.fail_after(LIMIT_S * 3):
        async with _serving(state_dir, "up", "serving_apps:streamed_body") as port:
            answers = Answers()
            async with trio.open_nursery() as nursery:
                chunked = b"POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                for _ in range(40):  # under the 64 KiB buffer for 30 s: read before a slot
                    nursery.start_soon(_trickle, port, chunked, True, answers)
                huge = b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"
                for _ in range(20):  # uploads: 16 under way from one address, the rest 429
                    nursery.start_soon(_trickle, port, huge, False, answers)
                await answers.at_least(4)
                # Those four were refused, by name, at once: the rest are under way.
                assert all(a.startswith(b"HTTP/1.1 429 ") for a in answers.seen), answers.seen
                assert all(b"TooManyUploads" in a for a in answers.seen), answers.seen
                # Another client, with the room of two requests held by no one, is served:
                # a GET, and a body sent whole. Timed for the record; bounded generously (a
                # machine at load 20), far under the 10 s the queue would have cost.
                for method, body in (("GET", None), ("POST", b"y" * 50_000)):
                    began = time.monotonic()
                    answer = await request(port, "/up", method=method, body=body)
                    took = time.monotonic() - began
                    assert answer.status == 200, answer
                    assert answer.json()["bytes"] == len(body or b"")
                    print(f"{method} served in {took * 1000:.0f} ms beside 56 slow uploads")
                    assert took < 5, took
                # The daemon's metrics say what was refused, and what is under way.
                metrics = (await request(port, "/-/metrics")).body.decode()
                assert 'ingress_rejected_total{backend="up",cause="client_uploads"} 4.0' in (
                    metrics
                )
                # The 16 uploads are in flight (the load the autoscaler sees), the 40 bodies
                # still being read are not.
                assert 'ingress_in_flight{backend="up"} 16.0' in metrics, metrics
                nursery.cancel_scope.cancel()
            assert len(answers.seen) == 4


async def test_an_upload_takes_a_place_in_the_replica_once_its_body_has_come(
    state_dir: Path,
) -> None:
    """Found by the trial of the fix: uploads ran their handlers beside the replica's places,
    so forty 100 KB bodies ran forty handlers at once where `max_ongoing_requests` said two.
    The body arrives beside the places; what the handler does with it is within them."""
    with trio.fail_after(LIMIT_S * 3):
        async with _serving(state_dir, "count", "serving_apps:Counting") as port:
            answers = []

            async def upload() -> None:
                body = b"u" * 100_000  # beyond the 64 KiB the ingress reads first
                answers.append(await request(port, "/count/digest?s=0.2", method="POST", body=body))

            async with trio.open_nursery() as nursery:
                for _ in range(12):  # (within the 16 one address may have under way)
                    nursery.start_soon(upload)
            assert [a.status for a in answers] == [200] * 12
            assert all(a.json()["bytes"] == 100_000 for a in answers)
            stats = (await request(port, "/count/stats")).json()
            assert stats["finished"] == 12
            assert stats["most"] <= 2, stats
