"""The HTTP replica of the ingress benchmark (``bench/ingress_bench.py``): a lean HTTP/1.1
keep-alive server on asyncio, in a thread of its own, so that the replica costs little CPU and
the figures are the proxies'.

``GET`` anything: a small JSON answer. With ``work_ms`` 0 it is written at once, from the event
loop. With ``work_ms`` > 0 the replica serves one request at a time (a worker thread sleeps
``work_ms`` for each, in arrival order), so that it sustains at most 1000 / ``work_ms``
requests a second: a replica that does its work on one core. ``slow_claim`` (a path): the
first replica to create that file takes ``slow_ms`` per request instead, and says
``"slow": true`` in its answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import threading
import time
from typing import cast

from controller.worker import context


class Trivial:
    def __init__(self, work_ms: float = 0.0, slow_ms: float = 0.0, slow_claim: str = "") -> None:
        self.slow = False
        if slow_claim:
            try:
                os.close(os.open(slow_claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                self.slow = True
            except FileExistsError:
                pass
        self.work_s = (slow_ms if self.slow else work_ms) / 1000
        body = {"replica": context().tag, "ok": True}
        if self.slow:
            body["slow"] = True
        payload = json.dumps(body).encode()
        self.response = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        self.loop = asyncio.new_event_loop()
        self.jobs: queue.SimpleQueue[asyncio.Transport] = queue.SimpleQueue()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("the HTTP server did not start within 10 s")
        if self.work_s:
            threading.Thread(target=self._work, daemon=True).start()

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        ctx = context()
        server = self.loop.run_until_complete(
            self.loop.create_server(lambda: _Conn(self), ctx.host, ctx.port, backlog=1024)
        )
        self.server = server
        ready.set()
        self.loop.run_forever()

    def _work(self) -> None:
        # One request at a time, in the order they came: the replica's capacity is 1 / work_s.
        while True:
            transport = self.jobs.get()
            time.sleep(self.work_s)
            self.loop.call_soon_threadsafe(_answer, transport, self.response)

    def check_health(self) -> None:
        if not self.thread.is_alive():
            raise RuntimeError("the HTTP server thread stopped")

    def drain(self) -> None:
        def close() -> None:
            self.server.close()

        self.loop.call_soon_threadsafe(close)


def _answer(transport: asyncio.Transport, response: bytes) -> None:
    if not transport.is_closing():
        transport.write(response)


class _Conn(asyncio.Protocol):
    def __init__(self, replica: Trivial) -> None:
        self.replica = replica
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not asyncio's own class under uvloop (a Ray actor's loop policy): a cast, no check.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                length = int(head[at + 17 :].split(b"\r\n", 1)[0])
            if len(self.buffer) < end + 4 + length:
                return  # the body is still coming
            self.buffer = self.buffer[end + 4 + length :]
            assert self.transport is not None
            if self.replica.work_s:
                self.replica.jobs.put(self.transport)
            else:
                self.transport.write(self.replica.response)
