"""Backends that call each other through handles, as the tests deploy them
(``handle_apps:NAME``): a chain of links, each calling the next; a class whose methods are
called; and counts of what was cancelled, read at ``/stats`` (``?until=cancelled&n=N`` answers
once N were, so that a test waits for it without polling)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import trio
import trio.lowlevel

from controller import RemoteError, Request, Response
from controller.worker import context, handle


class Link:
    """One link of a chain: calls `then` (a backend) with the same path and query, or, at the
    end, sleeps ``?s=N`` seconds. Counts the requests cancelled while inside."""

    def __init__(self, then: str | None = None) -> None:
        self.then = then
        self.inside = 0
        self.cancelled = 0
        self.entered = 0
        self.finished = 0
        """Requests its handler took, and those whose ``finally`` ran."""
        self.moved = trio.Event()

    def _moved(self) -> None:
        self.moved.set()
        self.moved = trio.Event()

    async def __call__(self, request: Request) -> Any:
        if request.path.endswith("/stats"):
            until = request.query_params.get("until")
            if until is not None:
                while getattr(self, until) < int(request.query_params["n"]):
                    await self.moved.wait()
            return {"inside": self.inside, "cancelled": self.cancelled}
        self.inside += 1
        self.entered += 1
        self._moved()
        left = request.time_left()  # on arrival
        try:
            if self.then is not None:
                target = request.target.decode()
                answer = await handle(self.then).request("GET", target)
                if answer.status != 200:  # (a 504 from below, say) passed on as it is
                    return Response(answer.body, status_code=answer.status)
                here = context()
                then = answer.json()
                return {"via": here.backend, "version": here.version, "left": left, "then": then}
            await trio.sleep(float(request.query_params.get("s", "0")))
            return {"at": context().backend, "version": context().version, "left": left}
        except trio.Cancelled:
            self.cancelled += 1
            raise
        finally:
            self.inside -= 1
            self.finished += 1
            self._moved()


class Calculator:
    """Methods a handle calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.getters = 0
        self.helper = str.upper  # callable, but an attribute: no handle's to call

    @property
    def expensive(self) -> int:
        self.getters += 1  # a side effect a call's lookup must not cause
        return 1

    def getter_runs(self) -> int:
        return self.getters

    async def drip(self, n: int, every_s: float) -> AsyncIterator[int]:
        for i in range(n):
            await trio.sleep(every_s)
            yield i

    async def slow(self, seconds: float) -> str:
        await trio.sleep(seconds)
        return "slept"

    def add(self, a: float, b: float) -> float:
        self.calls += 1
        return a + b

    async def describe(self, *, name: str = "x") -> dict[str, Any]:
        return {"name": name, "tag": context().tag}

    def fail(self) -> None:
        raise KeyError("no such thing")

    async def count_to(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            await trio.lowlevel.checkpoint()
            yield i

    def reconfigure(self, config: Any) -> None:
        pass

    async def __call__(self, request: Request) -> str:
        return "calculator"


class Shelf(dict[str, Any]):
    """A class of methods that subclasses dict: its own methods are called, dict's are not."""

    def __init__(self) -> None:
        super().__init__(model="m1", secret="s")

    def model(self) -> Any:
        return self["model"]


class Front:
    """Calls the calculator through a handle from its own handler: ``/add?a=1&b=2``; a method
    that raises there is answered 502 with its error."""

    async def __call__(self, request: Request) -> Any:
        a, b = (float(request.query_params[k]) for k in ("a", "b"))
        calculator = handle("calc")
        try:
            total = await calculator.add(a, b)
            if request.query_params.get("who"):
                return {"sum": total, "tag": (await calculator.describe())["tag"]}
            return {"sum": total}
        except RemoteError as exc:
            return {"error": exc.kind, "message": str(exc)}
