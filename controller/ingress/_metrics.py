"""The ingress's Prometheus metrics, in a registry of its own (a standalone ingress serves it on
``/-/metrics``; the daemon sums its ingress processes' on ``/metrics``).

Counting is plain dictionary arithmetic on the request path; the Prometheus families are built
only when scraped (prometheus_client's own counters take a lock and a label lookup per call,
which cost more than the rest of a request's bookkeeping)."""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from typing import final

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .._http.framing import RequestHead

access_logger = logging.getLogger("controller.ingress.access")

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


@final
class IngressMetrics:
    """What an ingress counts. `load` gives, per backend, requests in flight and queued;
    `connections` the open and idle client connections; `policies` what each backend's
    request policies did (``BackendRoutes.counts``)."""

    def __init__(
        self,
        load: Callable[[], Mapping[str, tuple[int, int]]],
        connections: Callable[[], tuple[int, int]] = lambda: (0, 0),
        policies: Callable[[], Mapping[str, Mapping[str, int]]] = dict,
        *,
        access_log: bool = False,
    ) -> None:
        self.requests_by: dict[tuple[str, str, int], int] = {}
        self.latency_by: dict[str, list[float]] = {}  # bucket counts, then sum, then count
        self.access_log = access_log
        self.rejected_by: dict[tuple[str, str], int] = {}
        self.bad_requests_by: dict[int, int] = {}
        self.refused_by: dict[str, int] = {}
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(self, load, connections, policies))

    def done(
        self, head: RequestHead, peer: str, backend: str, route: str, status: int, started: float
    ) -> None:
        """A request's end: counted, and logged if the access log is on."""
        elapsed = trio.current_time() - started
        self.request(backend, route, status, elapsed)  # "-": no route
        if self.access_log:
            method, target = head.method.decode("latin-1"), head.target.decode("latin-1")
            fields = {
                "peer": peer,
                "method": method,
                "target": target,
                "backend": backend,
                "status": status,
                "duration_ms": round(elapsed * 1000, 3),
            }
            access_logger.info(
                "%s %s %s -> %s %d %.1f ms",
                *(peer, method, target, backend, status, elapsed * 1000),
                extra={"fields": fields},
            )

    def request(self, backend: str, route: str, code: int, seconds: float) -> None:
        key = (backend, route, code)
        self.requests_by[key] = self.requests_by.get(key, 0) + 1
        counts = self.latency_by.get(backend)
        if counts is None:
            counts = self.latency_by[backend] = [0.0] * (len(LATENCY_BUCKETS) + 3)
        counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        counts[-2] += seconds
        counts[-1] += 1

    def rejected(self, backend: str, cause: str) -> None:
        key = (backend, cause)
        self.rejected_by[key] = self.rejected_by.get(key, 0) + 1

    def bad_request(self, code: int) -> None:
        self.bad_requests_by[code] = self.bad_requests_by.get(code, 0) + 1

    def refused(self, cause: str) -> None:
        self.refused_by[cause] = self.refused_by.get(cause, 0) + 1


@final
class _Collector(Collector):
    def __init__(
        self,
        metrics: IngressMetrics,
        load: Callable[[], Mapping[str, tuple[int, int]]],
        connections: Callable[[], tuple[int, int]],
        policies: Callable[[], Mapping[str, Mapping[str, int]]],
    ):
        self._m = metrics
        self._load = load
        self._connections = connections
        self._policies = policies

    def collect(self) -> Iterator[Metric]:
        m = self._m
        requests = CounterMetricFamily(
            "ingress_requests",
            "Requests by backend, route and status code",
            labels=["backend", "route", "code"],
        )
        for (backend, route, code), n in sorted(m.requests_by.items()):
            requests.add_metric([backend, route, str(code)], n)
        yield requests
        latency = HistogramMetricFamily(
            "ingress_request_seconds",
            "From a request's head read to its response sent, by backend",
            labels=["backend"],
        )
        for backend, counts in sorted(m.latency_by.items()):
            cumulative, buckets = 0.0, list[tuple[str, float]]()
            bounds: tuple[float, ...] = (*LATENCY_BUCKETS, math.inf)
            for bound, observed in zip(bounds, counts, strict=False):
                cumulative += observed
                buckets.append((_le(bound), cumulative))
            latency.add_metric([backend], buckets, sum_value=counts[-2])
        yield latency
        yield from _policy_counters(self._policies())
        rejected = CounterMetricFamily(
            "ingress_rejected",
            "503 answers by backend and cause (queue_full, queue_timeout, no_replicas)",
            labels=["backend", "cause"],
        )
        for (backend, cause), n in sorted(m.rejected_by.items()):
            rejected.add_metric([backend, cause], n)
        yield rejected
        yield _counter(
            "ingress_bad_requests",
            "Requests refused unread, by status (400 malformed, 408 too slow, 414, 431, 501, 505)",
            "code",
            {str(k): v for k, v in m.bad_requests_by.items()},
        )
        yield _counter(
            "ingress_connections_refused",
            "Client connections closed unserved, by cause (per_client: the address has "
            "max_connections_per_client open; limit: max_connections open and none idle; "
            "evicted: idle, closed to make room for a new one)",
            "cause",
            m.refused_by,
        )
        open_now, idle_now = self._connections()
        connections = GaugeMetricFamily(
            "ingress_connections", "Client connections open, and of them idle", labels=["state"]
        )
        connections.add_metric(["open"], open_now)
        connections.add_metric(["idle"], idle_now)
        yield connections
        in_flight = GaugeMetricFamily(
            "ingress_in_flight", "Requests sent to replicas and not answered", labels=["backend"]
        )
        queued = GaugeMetricFamily(
            "ingress_queued", "Requests waiting for a replica with room", labels=["backend"]
        )
        for backend, (sent, waiting) in sorted(self._load().items()):
            in_flight.add_metric([backend], sent)
            queued.add_metric([backend], waiting)
        yield in_flight
        yield queued


#: What each request policy counts (``BackendRoutes.counts``' keys), as metrics.
_POLICY_COUNTERS = (
    (
        "ingress_retries",
        "retried",
        "Requests tried again on another replica (they never reached one, or may be sent "
        "twice and their replica closed unanswered)",
    ),
    (
        "ingress_retries_refused",
        "retry_refused",
        "Requests not tried again because the backend's retry budget was spent (502)",
    ),
    ("ingress_rate_limited", "rate_limited", "Requests refused by the backend's rate limit (429)"),
    (
        "ingress_affinity_kept",
        "keyed",
        "Requests with a session key sent to the key's own replica",
    ),
    (
        "ingress_affinity_spilled",
        "spilled",
        "Requests with a session key sent to the next replica on the ring, the key's own "
        "being at the load bound",
    ),
)


def _policy_counters(counts: Mapping[str, Mapping[str, int]]) -> Iterator[Metric]:
    for name, key, doc in _POLICY_COUNTERS:
        yield _counter(name, doc, "backend", {b: c[key] for b, c in counts.items() if c.get(key)})


def _counter(name: str, doc: str, label: str, values: Mapping[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(values.items()):
        family.add_metric([key], n)
    return family


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(float(bound))
