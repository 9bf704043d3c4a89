"""The ingress's Prometheus metrics, in a registry of its own (the daemon exports it beside
its own on ``/metrics``; a standalone ingress serves it on ``/-/metrics``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@final
class IngressMetrics:
    def __init__(self, load: Callable[[], Mapping[str, tuple[int, int]]]) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "ingress_requests",
            "Requests by backend, route and status code",
            ["backend", "route", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "ingress_request_seconds",
            "From a request's head read to its response sent, by backend",
            ["backend"],
            buckets=_LATENCY,
            registry=r,
        )
        self.retries = Counter(
            "ingress_retries",
            "Requests tried again on another replica (connection failed before sending)",
            ["backend"],
            registry=r,
        )
        self.rejected = Counter(
            "ingress_rejected",
            "503 answers by backend and cause (queue_full, queue_timeout, no_replicas)",
            ["backend", "cause"],
            registry=r,
        )
        r.register(_LoadCollector(load))


@final
class _LoadCollector(Collector):
    def __init__(self, load: Callable[[], Mapping[str, tuple[int, int]]]):
        self._load = load

    def collect(self) -> Iterator[Metric]:
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
