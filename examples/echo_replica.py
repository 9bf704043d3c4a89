"""A replica class that serves HTTP on the port the runtime hands it.

It follows the replica contract: ``__init__`` starts the server, ``reconfigure`` takes a new
greeting in place, ``check_health`` says whether the server still runs, and ``drain`` waits until
no request has been in flight for a moment (routers stop sending first), then closes the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from controller.worker import context


class Echo:
    def __init__(self, work_ms: float = 5.0, fail_every: int = 0) -> None:
        self.work_s = work_ms / 1000
        # A bad release for the canary example: every Nth request answers 500.
        self.fail_every = fail_every
        self.greeting = "hello"
        self.tag = context().tag
        self.in_flight = 0
        self.served = 0
        self.lock = threading.Condition()
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep connections open: the ingress reuses them
            # Headers and body go out in two writes: without this, Nagle's algorithm holds the
            # body until the client's delayed ACK, 40 ms per request on a kept connection.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                with replica.lock:
                    replica.in_flight += 1
                try:
                    time.sleep(replica.work_s)  # stand-in for real work
                    if replica.fail_every and (replica.served + 1) % replica.fail_every == 0:
                        self.send_response(500)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    body = json.dumps(
                        {"replica": replica.tag, "greeting": replica.greeting, "pid": os.getpid()}
                    ).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        self.wfile.write(body)  # fails only if the client gave up waiting
                finally:
                    with replica.lock:
                        replica.in_flight -= 1
                        replica.served += 1
                        replica.lock.notify_all()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per request would drown the worker's log

        self.server = _Server((context().host, context().port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        # Its log (`controller logs`, the console's log page) says what it is doing.
        print(f"{self.tag}: serving HTTP on {context().host}:{context().port}", flush=True)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self.greeting = user_config.get("greeting", self.greeting)
        print(f"{self.tag}: greeting is now {self.greeting!r}", flush=True)

    def check_health(self) -> None:
        if not self.thread.is_alive():
            raise RuntimeError("the HTTP server thread stopped")

    def drain(self) -> None:
        # Routers drop a stopping replica before it is asked to drain, but a request they picked
        # just before may still be on its way: wait for a quiet moment with nothing in flight.
        quiet_s = 0.2
        with self.lock:
            while True:
                if self.in_flight:
                    self.lock.wait()  # woken when a request ends
                    continue
                before = self.served
                self.lock.wait(quiet_s)  # woken early only if a request ends meanwhile
                if self.in_flight == 0 and self.served == before:
                    break
        self.server.shutdown()
        self.server.server_close()  # late clients now get a refusal (routers retry) at once
        print(f"{self.tag}: drained after {self.served} requests", flush=True)


class _Server(ThreadingHTTPServer):
    # The standard library listens with a backlog of 5: a replica scaled up from zero that an
    # ingress opens a hundred connections to at once would leave most of them unaccepted.
    request_queue_size = 1024
