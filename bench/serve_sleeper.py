"""The serving benchmark's handler that waits to be cancelled (``bench/serve_bench.py``): each
request to ``/sleep`` sleeps 10 s unless cancelled, and notes (by CLOCK_MONOTONIC, which every
process on the machine shares) when its cancellation arrived; ``/stats?cancelled=N`` answers
once N requests were cancelled, ``/stats?inside=N`` once N are inside, with those times."""

from __future__ import annotations

import time
from typing import Any

import trio


class Sleeper:
    def __init__(self) -> None:
        self.inside = 0
        self.cancelled_at: list[float] = []
        self.moved = trio.Event()

    def _moved(self) -> None:
        self.moved.set()
        self.moved = trio.Event()

    async def __call__(self, request: Any) -> dict[str, Any]:
        if request.path.endswith("/stats"):
            inside = int(request.query_params.get("inside", "0"))
            cancelled = int(request.query_params.get("cancelled", "0"))
            while self.inside < inside or len(self.cancelled_at) < cancelled:
                await self.moved.wait()
            return {"inside": self.inside, "cancelled_at": self.cancelled_at}
        self.inside += 1
        self._moved()
        try:
            await trio.sleep(10)
            return {"slept": 10}
        except trio.Cancelled:
            self.cancelled_at.append(time.monotonic())
            raise
        finally:
            self.inside -= 1
            self._moved()
