"""The last hour of each backend's replicas and load, for the console's chart.

A point is kept when a number changed (a step chart: each value holds until the next point), at
most one per `RESOLUTION_S` (a later change within it replaces it), so a backend keeps at most
``WINDOW_S / RESOLUTION_S`` points however busy it is. Kept in the daemon's memory only: a
restarted daemon's chart starts afresh.
"""

from __future__ import annotations

import collections
from collections.abc import Generator, Iterable
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from .._backend.turns import TURN_EVERY, in_turns
from .._clock import wall_now
from .._model.views.status import BackendNumbers
from .views import iso

if TYPE_CHECKING:
    from .serving import Serving

WINDOW_S = 3600.0
RESOLUTION_S = 5.0
#: The least time between two samples of every backend: a controller passes many times a second
#: (every health check is a pass), and a sample reads every backend's counts.
SAMPLE_GAP_S = 2.0


@attrs.frozen
class Point:
    time: float
    desired: int
    ready: int
    in_flight: int
    queued: int

    def same_numbers(self, other: Point) -> bool:
        return (self.desired, self.ready, self.in_flight, self.queued) == (
            other.desired,
            other.ready,
            other.in_flight,
            other.queued,
        )


@final
class Timelines:
    def __init__(self) -> None:
        self._points: dict[str, collections.deque[Point]] = {}

    def sample(self, numbers: Iterable[BackendNumbers], now: float) -> None:
        """Take every backend's numbers at wall time `now`; forget backends no longer there."""
        for _ in self._sampling(numbers, now):
            pass

    async def sample_in_turns(self, numbers: Iterable[BackendNumbers], now: float) -> None:
        """`sample`, letting the loop's other tasks run every `TURN_EVERY` backends: a sample
        of 10,000 backends in one go held the loop 200 to 300 ms."""
        await in_turns(self._sampling(numbers, now))

    def _sampling(self, numbers: Iterable[BackendNumbers], now: float) -> Generator[None]:
        before = set(self._points)
        seen: set[str] = set()
        for done, n in enumerate(numbers, 1):
            seen.add(n.name)
            self._add(n.name, Point(now, n.desired, n.ready, n.in_flight, n.queued))
            if done % TURN_EVERY == 0:
                yield
        # Only those known before it began: one added meanwhile is not gone.
        for gone in before - seen:
            self._points.pop(gone, None)

    def _add(self, name: str, point: Point) -> None:
        points = self._points.get(name)
        if points is None:
            self._points[name] = collections.deque([point])
            return
        last = points[-1]
        if last.same_numbers(point):
            return
        if len(points) > 1 and last.time // RESOLUTION_S == point.time // RESOLUTION_S:
            points[-1] = point
        else:
            points.append(point)
        # The newest point from before the window stays: it says where the chart starts.
        while len(points) > 1 and points[1].time <= point.time - WINDOW_S:
            points.popleft()

    def json(self, name: str) -> dict[str, Any]:
        """``GET /api/v1/backends/{name}/history``: oldest first."""
        return {
            "name": name,
            "window_s": WINDOW_S,
            "points": [
                {
                    "time": iso(p.time),
                    "desired": p.desired,
                    "ready": p.ready,
                    "in_flight": p.in_flight,
                    "queued": p.queued,
                }
                for p in self._points.get(name, ())
            ],
        }


async def record(serving: Serving, timelines: Timelines) -> None:
    """Sample whatever the daemon serves from (its controller, or a standby's view) after each
    change, at most once per `SAMPLE_GAP_S`. Runs until cancelled."""
    while True:
        ctl = serving.ctl
        if ctl is None:
            await serving.wait_switched()
            continue
        cursor = ctl.passes
        # The wall clock, not trio's: the points are shown as times of day, and a daemon's
        # chart is not driven by a test's MockClock.
        await timelines.sample_in_turns(ctl.numbers(), wall_now())
        await trio.sleep(SAMPLE_GAP_S)
        await serving.wait_changed(ctl, cursor)
