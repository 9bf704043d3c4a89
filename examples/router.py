"""A small router: follows the controller's watch snapshots and spreads requests over the replicas
that serve, round robin. A request whose connection is refused (a replica that just finished
draining) is retried once on another replica, as routers do.
"""

from __future__ import annotations

import collections
import itertools
import json
from typing import Any, final

import trio

import controller


class NoReplicaError(Exception):
    """No replica serves the backend right now."""


@final
class Router:
    def __init__(self, ctl: controller.Controller, backend: str):
        self.ctl = ctl
        self.backend = backend
        self.addresses: list[str] = []
        self._cycle: itertools.cycle[str] = itertools.cycle(())
        self.ok: collections.Counter[str] = collections.Counter()
        self.failed = 0
        self.retried = 0
        self._have_replicas = trio.Event()

    async def follow(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the replica list in step with the watch (start with ``nursery.start``)."""
        snapshot = self.ctl.snapshot(self.backend)
        self._take(snapshot)
        task_status.started()
        async for snapshot in self.ctl.watch(self.backend):
            self._take(snapshot)

    def _take(self, snapshot: controller.BackendSnapshot) -> None:
        self.addresses = [r.address for r in snapshot.replicas if r.address]
        self._cycle = itertools.cycle(self.addresses)
        if self.addresses:
            self._have_replicas.set()
        else:
            self._have_replicas = trio.Event()

    async def request(self) -> dict[str, Any]:
        """Send one GET to the next replica; retry once elsewhere if the connection is refused."""
        await self._have_replicas.wait()
        for attempt in range(2):
            address = next(self._cycle)
            try:
                reply = await _get(address)
            except OSError:
                if attempt == 0 and len(self.addresses) > 0:
                    self.retried += 1
                    continue
                self.failed += 1
                raise
            self.ok[reply["replica"]] += 1
            return reply
        raise AssertionError("unreachable")


async def _get(address: str) -> dict[str, Any]:
    """A minimal HTTP/1.0 GET (the example needs no HTTP client library)."""
    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(f"GET / HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        data = bytearray()
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1:2]
    if status != [b"200"]:
        raise OSError(f"{address} answered {head[:40]!r}")
    reply: dict[str, Any] = json.loads(body)
    return reply
