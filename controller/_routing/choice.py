"""The ingress's decisions, as pure functions: which backend a path goes to, and which replica
takes a request. No I/O and no trio: property-tested on their own."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence

import attrs


@attrs.frozen
class RouteTable:
    """Route prefixes to backend names. A path goes to the longest prefix that is the path or
    one of its ancestors by whole segments (``/echo`` takes ``/echo`` and ``/echo/x``, not
    ``/echoes``); ``/`` takes whatever no other prefix does."""

    routes: Mapping[str, str] = attrs.field(factory=dict)
    _depths: tuple[int, ...] = attrs.field(init=False)
    """The segment counts of the prefixes, deepest first: a path is looked up at these alone."""

    @_depths.default
    def _count_depths(self) -> tuple[int, ...]:
        return tuple(sorted({_depth(p) for p in self.routes if p != "/"}, reverse=True))

    @classmethod
    def build(cls, claims: Iterable[tuple[str, str]]) -> tuple[RouteTable, list[str]]:
        """A table from (prefix, backend) claims; a prefix claimed twice goes to the lower
        name (deterministic in every ingress), and each loser is named in the list returned."""
        routes: dict[str, str] = {}
        losers: list[str] = []
        for prefix, backend in sorted(claims, key=lambda claim: (claim[0], claim[1])):
            if prefix in routes:
                losers.append(backend)
            else:
                routes[prefix] = backend
        return cls(routes), losers

    def match(self, path: str) -> str | None:
        """The backend for `path` (the request target without its query), or None.

        One dict lookup per depth a prefix has (not per segment of the path, nor per byte):
        the path is cut once, at its first `max depth` + 1 slashes, so its length costs one
        scan in C, however long it is."""
        routes = self.routes
        depths = self._depths
        if depths:
            parts = path.split("/", depths[0] + 1)
            if parts[-1] == "" and len(parts) > 1:
                parts.pop()  # a trailing slash: /echo/ is /echo
            for depth in depths:
                if depth < len(parts):
                    backend = routes.get("/".join(parts[: depth + 1]))
                    if backend is not None:
                        return backend
        return routes.get("/")


def _depth(prefix: str) -> int:
    """How many segments a route prefix has (``/a/b``: 2)."""
    return prefix.rstrip("/").count("/")


#: How often a choice ignores the answer times and goes by requests in flight alone: a replica
#: that was slow and is fast again gets requests, and so a fresh answer time, before long.
EXPLORE = 0.005
_UNTIMED_S = 1e-6


def choose(
    loads: Sequence[int],
    limit: int,
    rng: random.Random,
    excluded: frozenset[int] = frozenset(),
    latencies: Sequence[float] | None = None,
) -> int | None:
    """Power of two choices: of two replicas drawn at random, the one a request would wait on
    least. With `latencies` (how fast each replica answers) that is the lower
    ``(in flight + 1) * latency``, the expected wait (Finagle's and Linkerd's least-loaded
    rule), so a replica ten times slower than the others is chosen only once they hold ten
    times its load; without, the one with fewer requests in flight. A replica at `limit` is
    never chosen; if both draws are full, the least loaded of the others is (a scan, only when
    the backend is nearly full). None: every replica is at `limit` (or excluded), so the request
    must wait."""
    n = len(loads)
    if n - len(excluded) <= 0:
        return None
    if not excluded and n >= 2:
        draw = rng.random  # randrange costs ten times as much, on every request
        i = int(draw() * n)
        j = int(draw() * (n - 1))
        if j >= i:
            j += 1  # two distinct replicas
        if latencies is not None and draw() >= EXPLORE:
            # Not timed yet (0): as fast as can be, but still weighed by what it holds.
            latency_i, latency_j = latencies[i], latencies[j]
            cost_i = (loads[i] + 1) * (latency_i if latency_i > _UNTIMED_S else _UNTIMED_S)
            cost_j = (loads[j] + 1) * (latency_j if latency_j > _UNTIMED_S else _UNTIMED_S)
        else:
            cost_i, cost_j = loads[i], loads[j]
        best, other = (i, j) if cost_i <= cost_j else (j, i)
        if loads[best] < limit:
            return best
        if loads[other] < limit:
            return other
    best_load, best = limit, -1
    for index, load in enumerate(loads):
        if load < best_load and index not in excluded:
            best_load, best = load, index
    return None if best < 0 else best


def choose_near(
    near: list[int], loads: Sequence[int], limit: int, rng: random.Random
) -> int | None:
    """Power of two choices among a few of the replicas (`near`, indices into `loads`: those
    at this ingress's host, those of one side of a split, those that hold a model): the less
    loaded of two drawn, if it has room, else the least loaded of them with room (a scan of the
    few); None if all are full (the caller then looks further)."""
    i = near[int(rng.random() * len(near))]
    j = near[int(rng.random() * len(near))]
    best = i if loads[i] <= loads[j] else j
    if loads[best] < limit:
        return best
    least = min(near, key=loads.__getitem__)
    return least if loads[least] < limit else None
