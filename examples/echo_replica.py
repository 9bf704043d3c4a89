"""A replica class the worker calls for each request: ``__call__`` answers (a dict is sent as
JSON), ``reconfigure`` takes a new greeting in place, ``drain`` says how many it answered. The
worker serves its HTTP: a sync ``__call__`` runs in the replica's thread pool, so a request that
blocks holds one thread, not the replica; when the replica drains, the requests under way end
before ``drain`` is called."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from controller import Request, Response
from controller.worker import context


class Echo:
    def __init__(self, work_ms: float = 5.0, fail_every: int = 0) -> None:
        self.work_s = work_ms / 1000
        # A bad release for the canary example: every Nth request answers 500.
        self.fail_every = fail_every
        self.greeting = "hello"
        self.tag = context().tag
        self.served = itertools.count(1)  # next() is atomic: handlers run in several threads
        self.answered = 0

    def __call__(self, request: Request) -> dict[str, Any] | Response:
        time.sleep(self.work_s)  # stand-in for real work
        self.answered = n = next(self.served)
        if self.fail_every and n % self.fail_every == 0:
            return Response(status_code=500)
        return {"replica": self.tag, "greeting": self.greeting, "pid": os.getpid()}

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self.greeting = user_config.get("greeting", self.greeting)
        # Its log (`controller logs`, the console's log page) says what it is doing.
        print(f"{self.tag}: greeting is now {self.greeting!r}", flush=True)

    def drain(self) -> None:
        print(f"{self.tag}: drained after {self.answered} requests", flush=True)
