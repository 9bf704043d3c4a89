"""An HTTP replica for the ingress tests, with a path for each way a replica can behave.

GET /any             {"replica", "pid", "path", "headers"} at once
GET /slow?ms=N       the same after N ms (``delay_ms`` from init adds to every request)
GET /hang            never answers (until the client goes away)
GET /cut             sends a head promising 1,000,000 bytes, 10 of them, then closes
GET /stream?n=N      a chunked answer of N chunks of 64 KiB
POST /sha            reads the whole body, answers its length and sha256
GET /stray           answers "ok", then sends bytes that look like another answer
POST /early          answers 413 without reading the body, and keeps the connection open
GET /watch-cancel    waits until the client hangs up, then appends "cancelled" to ``record``
GET /drop            the replica that claimed ``slow_claim`` closes the connection unanswered
GET /fail            503 at once: a request the app fails, whatever the revision

``error_every=N`` (init) answers every Nth request (of any path) with a 500: a bad release.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from controller.worker import context


class HTTPReplica:
    serves_itself = True  # its own HTTP server on the replica's port

    def __init__(
        self, delay_ms: float = 0.0, record: str = "", slow_claim: str = "", error_every: int = 0
    ) -> None:
        self.tag = context().tag
        self.error_every = error_every
        self.served = 0
        self.delay_s = delay_ms / 1000
        self.record = record
        self.slow_claimed = False
        if slow_claim:
            # Only the replica that creates the claim file first is slow: one slow, one fast.
            try:
                os.close(os.open(slow_claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                self.slow_claimed = True
            except FileExistsError:
                self.delay_s = 0.0
        self.in_flight = 0
        self.lock = threading.Condition()
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                with replica.lock:
                    replica.in_flight += 1
                try:
                    replica.handle(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with replica.lock:
                        replica.in_flight -= 1
                        replica.lock.notify_all()

            do_POST = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _Server((context().host, context().port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        path = url.path.rstrip("/").rsplit("/", 1)[-1]
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.error_every:
            with self.lock:
                self.served += 1
                failing = self.served % self.error_every == 0
            if failing:
                h.send_response(500)
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
        if path == "fail":
            h.send_response(503)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if path == "slow":
            time.sleep(float(query.get("ms", "100")) / 1000)
        if path == "hang":
            _wait_for_hangup(h)
            return
        if path == "drop" and self.slow_claimed:
            # Dies with the request, as a replica whose node is lost: no answer at all.
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if path == "cut":
            h.send_response(200)
            h.send_header("Content-Length", "1000000")
            h.end_headers()
            h.wfile.write(b"0123456789")
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return
        if path == "stream":
            h.send_response(200)
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            chunk = b"x" * 65536
            for _ in range(int(query.get("n", "16"))):
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            h.wfile.write(b"0\r\n\r\n")
            return
        if path == "stray":
            h.send_response(200)
            h.send_header("Content-Length", "2")
            h.end_headers()
            h.wfile.write(b"ok" + b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nPOISONED")
            return
        if path == "early":
            h.send_response(413)
            h.send_header("Content-Length", "0")
            h.end_headers()
            h.wfile.flush()
            _wait_for_hangup(h)  # reads nothing more: the body stays unread
            return
        if path == "sha":
            digest = hashlib.sha256()
            length = 0
            if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
                while True:
                    size = int(h.rfile.readline().strip().split(b";")[0], 16)
                    if size == 0:
                        h.rfile.readline()
                        break
                    data = h.rfile.read(size)
                    h.rfile.readline()
                    digest.update(data)
                    length += len(data)
            else:
                left = int(h.headers.get("Content-Length", "0"))
                while left:
                    data = h.rfile.read(min(left, 1 << 20))
                    digest.update(data)
                    length += len(data)
                    left -= len(data)
            self._json(h, {"length": length, "sha256": digest.hexdigest()})
            return
        if path == "watch-cancel":
            # `record` is a FIFO the test reads: it hears each step as it happens.
            with open(self.record, "w") as fifo:
                fifo.write("waiting\n")
                fifo.flush()
                _wait_for_hangup(h)
                fifo.write("cancelled\n")
            return
        self._json(
            h,
            {
                "replica": self.tag,
                "pid": os.getpid(),
                "path": h.path,
                "headers": {k.lower(): v for k, v in h.headers.items()},
            },
        )

    def _json(self, h: BaseHTTPRequestHandler, data: object) -> None:
        body = json.dumps(data).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def drain(self) -> None:
        # Routers drop a stopping replica before it is asked to drain; a request picked just
        # before may still be on its way: wait for a quiet moment with nothing in flight.
        with self.lock:
            while True:
                if self.in_flight:
                    self.lock.wait()
                    continue
                self.lock.wait(0.2)
                if self.in_flight == 0:
                    break
        self.server.shutdown()
        self.server.server_close()


def _wait_for_hangup(h: BaseHTTPRequestHandler) -> None:
    """Block until the peer closes the connection (the socket reads EOF)."""
    sock = h.connection
    while True:
        readable, _, _ = select.select([sock], [], [], 1.0)
        if readable and not sock.recv(1, 0x2):  # MSG_PEEK: b"" is EOF
            return


class _Server(ThreadingHTTPServer):
    # The standard library listens with a backlog of 5: a replica scaled up from zero that an
    # ingress opens a hundred connections to at once would leave most of them unaccepted.
    request_queue_size = 1024
