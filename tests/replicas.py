"""Replica classes for the LocalRuntime tests; each records what happened to it in a file."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import trio


class Recorder:
    """Appends one JSON line per call of the replica contract to `path`."""

    def __init__(self, path: str, drain_s: float = 0.0, healthy: bool = True):
        self.path = path
        self.drain_s = drain_s
        self.healthy = healthy
        self.note("init", pid=os.getpid())

    def note(self, what: str, **extra: Any) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"what": what, "pid": os.getpid(), **extra}) + "\n")

    def reconfigure(self, user_config: Any) -> None:
        self.note("reconfigure", config=user_config)

    def check_health(self) -> None:
        if not self.healthy:
            raise RuntimeError("unhealthy on purpose")

    async def drain(self) -> None:
        self.note("drain")
        await trio.sleep(self.drain_s)
        self.note("drained")


class FailsInInit:
    def __init__(self) -> None:
        raise ValueError("bad port")


class Trivial:
    """Does nothing: for start-up benchmarks."""


class SlowInit:
    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)


def events(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f]
    except FileNotFoundError:
        return []
