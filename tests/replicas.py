"""Replica classes for the LocalRuntime tests; each records what happened to it in a file."""

from __future__ import annotations

import ctypes
import json
import os
import signal
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
        if isinstance(user_config, dict) and user_config.get("fail"):
            raise ValueError("bad config")

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


class AbortsInInit:
    """Dies of a native fault as it starts (C code calling abort(), say)."""

    def __init__(self) -> None:
        os.abort()


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class FailsUnprintably:
    """Found by an attack: its error's str() raises, which took the worker down mid-start, and
    the daemon with it (a stop and the monitor both waited on the worker's pidfd)."""

    def __init__(self) -> None:
        raise Unprintable()


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


class BlockingRecorder:
    """Like Recorder, but with no trio in its methods (Ray actors run user code on asyncio) and a
    health check that a test fails from outside by creating ``<path>.sick.<pid>``."""

    def __init__(self, path: str, drain_s: float = 0.0):
        self.recorder = Recorder(path)
        self.drain_s = drain_s

    def reconfigure(self, user_config: Any) -> None:
        self.recorder.note("reconfigure", config=user_config)

    def check_health(self) -> None:
        if os.path.exists(f"{self.recorder.path}.sick.{os.getpid()}"):
            raise RuntimeError("made sick by the test")

    def drain(self) -> None:
        self.recorder.note("drain")
        time.sleep(self.drain_s)
        self.recorder.note("drained")


class Talker:
    """Prints on start and on every new user config: for the log tests."""

    def __init__(self) -> None:
        print("talker up", flush=True)

    def reconfigure(self, user_config: Any) -> None:
        print(f"talker says {user_config}", flush=True)


class Forks:
    """Forks a child that outlives its constructor, as a replica using a process pool does: the
    child has the worker's command line, but is not the worker."""

    def __init__(self) -> None:
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)


class IgnoresTerm(Recorder):
    """A Recorder whose process ignores SIGTERM, so that its kill waits for SIGKILL. (Set from
    a thread, through libc: Python's own `signal` works only on the main thread.)"""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        ctypes.CDLL(None).signal(signal.SIGTERM, 1)  # SIG_IGN


class SelfReporting:
    """Says what its load is (``load()``): the number written in the file at `path` (0 if none),
    as a replica that receives its work some way other than the ingress would count it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> int:
        try:
            with open(self.path) as f:
                return int(f.read().strip() or 0)
        except FileNotFoundError:
            return 0


class CheckedByFile:
    """A sync ``check_health`` that a test steers through the file at `path` (or, for one
    replica, ``<path>.<its pid>``, which comes first): absent, it passes; ``fail TEXT`` raises
    RuntimeError(TEXT); ``slow SECONDS`` sleeps that long (in the worker's thread for sync user
    code), then passes, having first written to the FIFO at ``<path>.entered`` if there is one
    (so a test knows, without sleeping, that it hangs now). Its ``load()`` counts up, so that a
    test sees its pushes go on."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0

    def check_health(self) -> None:
        how, arg = "", ""
        for path in (f"{self.path}.{os.getpid()}", self.path):
            try:
                with open(path) as f:
                    how, _, arg = f.read().partition(" ")
                break
            except FileNotFoundError:
                continue
        if how == "fail":
            raise RuntimeError(arg)
        if how == "slow":
            if os.path.exists(f"{self.path}.entered"):
                with open(f"{self.path}.entered", "w") as entered:
                    entered.write("in")
            time.sleep(float(arg))

    def load(self) -> int:
        self.count += 1
        return self.count
