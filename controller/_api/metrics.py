"""Prometheus metrics for the daemon: an Observer for the loops, and wrappers that time what the
runtime and the store do. Kept out of the core, which knows only the Observer protocol."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar, final

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._model.views.status import BackendState
from .._ports.runtime import CheckReport, Runtime
from .._ports.store import Store
from .._ports.wrap import RuntimeWrapper, StoreWrapper

if TYPE_CHECKING:
    from .._leadership.keeper import Leadership
    from .._model.views.status import ControllerStatus

T = TypeVar("T")

# Controller work is sub-millisecond; replica starts take seconds.
_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
#: How often the loop's lag is sampled.
LAG_PERIOD_S = 0.05
_SLOW = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@final
class Metrics:
    """Everything the daemon exports on ``/metrics``, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "controller_events_handled", "Events handled by backend loops", ["backend"], registry=r
        )
        self.event_latency = Histogram(
            "controller_event_to_action_seconds",
            "From a loop taking events to every action of its pass launched",
            buckets=_FAST,
            registry=r,
        )
        self.failures = Counter(
            "controller_replica_failures",
            "Replica failures by backend and kind",
            ["backend", "kind"],
            registry=r,
        )
        self.late_checks_total = Counter(
            "controller_health_checks_late",
            "Health checks failed as late: due while the one before was unanswered",
            ["backend"],
            registry=r,
        )
        self.unknown_load_total = Counter(
            "controller_load_unknown_replicas",
            "Replicas named in load reports that the backend does not have: dropped",
            ["backend"],
            registry=r,
        )
        self.starts = Histogram(
            "controller_replica_start_seconds",
            "Replica start (or adoption) to ready, by outcome",
            ["outcome"],
            buckets=_SLOW,
            registry=r,
        )
        self.drains = Histogram(
            "controller_replica_drain_seconds", "Replica drains", buckets=_SLOW, registry=r
        )
        self.health_checks = Histogram(
            "controller_health_check_seconds",
            "Health checks, by outcome",
            ["outcome"],
            buckets=(*_FAST, 5.0, 30.0),
            registry=r,
        )
        self._kinds: dict[str, set[str]] = {}  # failure kinds seen per backend
        self.scalings = Counter(
            "controller_autoscaler_decisions",
            "Changes of replica count made by the autoscaler, by backend and direction",
            ["backend", "direction"],
            registry=r,
        )
        self._directions: dict[str, set[str]] = {}
        self.rollouts = Counter(
            "controller_rollouts",
            "Rollouts of revisions that ended, by backend and outcome (complete or failed)",
            ["backend", "outcome"],
            registry=r,
        )
        self._outcomes: dict[str, set[str]] = {}
        self.loop_lag = Histogram(
            "controller_loop_lag_seconds",
            "How late a timer of the daemon's loop fires (sampled every 50 ms): how long the "
            "loop was busy when something was due",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.checkpoint_writes = Histogram(
            "controller_checkpoint_write_seconds",
            "Writes of intent to the store",
            buckets=_FAST,
            registry=r,
        )

    # -- the core's Observer protocol --

    def events_handled(self, backend: str, count: int, latency_s: float) -> None:
        self.events.labels(backend).inc(count)
        self.event_latency.observe(latency_s)

    def failure(self, backend: str, kind: str) -> None:
        self.failures.labels(backend, kind).inc()
        self._kinds.setdefault(backend, set()).add(kind)

    def late_checks(self, backend: str, count: int) -> None:
        self.late_checks_total.labels(backend).inc(count)

    def unknown_load(self, backend: str, count: int) -> None:
        self.unknown_load_total.labels(backend).inc(count)

    def autoscaled(self, backend: str, before: int, after: int) -> None:
        direction = "up" if after > before else "down"
        self.scalings.labels(backend, direction).inc()
        self._directions.setdefault(backend, set()).add(direction)

    def rollout(self, backend: str, outcome: str) -> None:
        self.rollouts.labels(backend, outcome).inc()
        self._outcomes.setdefault(backend, set()).add(outcome)

    def forgotten(self, backend: str) -> None:
        # A deleted backend's series go with it: name churn must not grow the exposition.
        with contextlib.suppress(KeyError):
            self.events.remove(backend)
        with contextlib.suppress(KeyError):
            self.late_checks_total.remove(backend)
        with contextlib.suppress(KeyError):
            self.unknown_load_total.remove(backend)
        for direction in self._directions.pop(backend, ()):
            with contextlib.suppress(KeyError):
                self.scalings.remove(backend, direction)
        for kind in self._kinds.pop(backend, ()):
            with contextlib.suppress(KeyError):
                self.failures.remove(backend, kind)
        for outcome in self._outcomes.pop(backend, ()):
            with contextlib.suppress(KeyError):
                self.rollouts.remove(backend, outcome)

    # -- wiring --

    def watch_status(self, status: Callable[[], ControllerStatus]) -> None:
        """Export replica counts, read from `status` at each scrape (no copy to keep fresh)."""
        self.registry.register(_ReplicaCollector(status))

    def watch_leadership(self, leadership: Leadership) -> None:
        """Export whether this daemon leads, the epoch, and the lease's counters."""
        self.registry.register(_LeadershipCollector(leadership))

    def wrap_runtime(self, runtime: Runtime) -> Runtime:
        return _TimedRuntime(runtime, self)

    def wrap_store(self, store: Store) -> Store:
        return _TimedStore(store, self)

    async def measure_loop_lag(self) -> None:
        """Sample the loop's lag until cancelled: a timer that asks to wake every
        `LAG_PERIOD_S`, and records how late it woke."""
        while True:
            due = trio.current_time() + LAG_PERIOD_S
            await trio.sleep_until(due)
            self.loop_lag.observe(max(0.0, trio.current_time() - due))

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


@final
class _ReplicaCollector(Collector):
    def __init__(self, status: Callable[[], ControllerStatus]):
        self._status = status

    def collect(self) -> Iterator[Metric]:
        replicas = GaugeMetricFamily(
            "controller_replicas",
            "Replicas by backend, state and version",
            labels=["backend", "state", "version"],
        )
        desired = GaugeMetricFamily(
            "controller_replicas_desired", "Desired replicas by backend", labels=["backend"]
        )
        states = GaugeMetricFamily(
            "controller_backend_state",
            "Each backend's state: 1 for the one it is in, 0 for the others",
            labels=["backend", "state"],
        )
        in_flight = GaugeMetricFamily(
            "controller_backend_requests_in_flight",
            "Requests the ingresses report in flight to the backend's replicas",
            labels=["backend"],
        )
        queued = GaugeMetricFamily(
            "controller_backend_requests_queued",
            "Requests the ingresses report waiting for one of the backend's replicas",
            labels=["backend"],
        )
        target = GaugeMetricFamily(
            "controller_autoscaler_target_replicas",
            "The replica count each autoscaled backend's autoscaler set",
            labels=["backend"],
        )
        load = GaugeMetricFamily(
            "controller_autoscaler_ongoing_requests",
            "The ongoing requests (in flight plus queued) the autoscaler last decided on",
            labels=["backend"],
        )
        revision = GaugeMetricFamily(
            "controller_backend_revision",
            "Each backend's revisions: the target (what it rolls out or runs), the current (the "
            "newest whose rollout completed) and the pending one (recorded while paused)",
            labels=["backend", "kind"],
        )
        paused = GaugeMetricFamily(
            "controller_backend_paused",
            "1 while a backend's rollouts are paused",
            labels=["backend"],
        )
        weight = GaugeMetricFamily(
            "controller_canary_weight_percent",
            "The percent of requests a canary release under way gets (0 once aborted)",
            labels=["backend", "revision"],
        )
        served = CounterMetricFamily(
            "controller_replica_requests_served",
            "Requests each replica has answered, by its own count (code the worker serves: a "
            "function, a callable class, an ASGI app)",
            labels=["backend", "replica"],
        )
        batches = CounterMetricFamily(
            "controller_replica_batches",
            "Batches each batched function (@controller.batch) of each replica has run",
            labels=["backend", "replica", "function"],
        )
        batched = CounterMetricFamily(
            "controller_replica_batched_items",
            "Items in those batches (divided by the batches: their mean size)",
            labels=["backend", "replica", "function"],
        )
        largest = GaugeMetricFamily(
            "controller_replica_batch_largest",
            "The largest batch each batched function of each replica has run",
            labels=["backend", "replica", "function"],
        )
        waited = CounterMetricFamily(
            "controller_replica_batch_wait_seconds",
            "Those batches' waits, each from its first item's arrival to its run, summed "
            "(divided by the batches: their mean wait)",
            labels=["backend", "replica", "function"],
        )
        held = GaugeMetricFamily(
            "controller_replica_models",
            "The models each multiplexed replica holds (and is loading)",
            labels=["backend", "replica"],
        )
        lookups = CounterMetricFamily(
            "controller_replica_model_lookups",
            "A multiplexed replica's loader calls: a hit found the model held, a miss waited "
            "for its load",
            labels=["backend", "replica", "result"],
        )
        loads_done = CounterMetricFamily(
            "controller_replica_model_loads",
            "Models each multiplexed replica has loaded",
            labels=["backend", "replica"],
        )
        evicted = CounterMetricFamily(
            "controller_replica_model_evictions",
            "Models each multiplexed replica has unloaded to make room (least recently used)",
            labels=["backend", "replica"],
        )
        by_model = GaugeMetricFamily(
            "controller_model_requests",
            "Requests that named each model (x-model-id), as the replicas serving now counted "
            "them since each started (the first 1,000 models a replica saw; the rest as "
            "'(other)')",
            labels=["backend", "model"],
        )
        judged = GaugeMetricFamily(
            "controller_canary_step_requests",
            "Requests the ingresses counted for each revision of a canary release in its step, "
            "and of them the errors",
            labels=["backend", "side", "kind"],
        )
        for backend in self._status().backends:
            rollout = backend.rollout
            canary = None if rollout is None else rollout.canary
            if canary is not None and canary.phase != "promoted":
                weight.add_metric([backend.name, str(canary.revision)], canary.weight)
                for side, numbers in (("canary", canary.canary), ("stable", canary.stable)):
                    judged.add_metric([backend.name, side, "requests"], numbers.requests)
                    judged.add_metric([backend.name, side, "errors"], numbers.errors)
            if rollout is not None:
                for kind, number in (
                    ("target", rollout.revision),
                    ("current", rollout.current_revision),
                    ("pending", rollout.pending_revision),
                ):
                    if number is not None:
                        revision.add_metric([backend.name, kind], number)
                paused.add_metric([backend.name], int(rollout.paused))
            in_flight.add_metric([backend.name], backend.load.in_flight)
            queued.add_metric([backend.name], backend.load.queued)
            for tag, count in sorted(backend.load.served.items()):
                served.add_metric([backend.name, tag], count)
            for tag, batchers in sorted(backend.load.batches.items()):
                for batcher in batchers:
                    labels = [backend.name, tag, batcher.function]
                    batches.add_metric(labels, batcher.batches)
                    batched.add_metric(labels, batcher.items)
                    largest.add_metric(labels, batcher.largest)
                    waited.add_metric(labels, batcher.waited_s)
            model_requests: dict[str, int] = {}
            for tag, said in sorted(backend.load.models.items()):
                held.add_metric([backend.name, tag], len(said.models))
                for result, count in (("hit", said.hits), ("miss", said.misses)):
                    lookups.add_metric([backend.name, tag, result], count)
                loads_done.add_metric([backend.name, tag], said.loads)
                evicted.add_metric([backend.name, tag], said.evictions)
                for model, count in said.requests.items():
                    model_requests[model] = model_requests.get(model, 0) + count
            for model, count in sorted(model_requests.items()):
                by_model.add_metric([backend.name, model], count)
            for (version, state), n in sorted(
                backend.counts_by_version.items(), key=lambda item: (item[0][0], item[0][1].value)
            ):
                replicas.add_metric([backend.name, state.value, version], n)
            desired.add_metric([backend.name], backend.desired_replicas)
            scaler = backend.autoscaler
            if scaler is not None:
                target.add_metric([backend.name], scaler.target)
                last = scaler.last
                if last is not None and last.ongoing is not None:
                    load.add_metric([backend.name], last.ongoing)
            # Every state, 1 for the one it is in (a state set): an alert can see one end.
            for each in BackendState:
                states.add_metric([backend.name, each.value], int(each is backend.state))
        yield replicas
        yield desired
        yield states
        yield in_flight
        yield queued
        yield target
        yield load
        yield revision
        yield paused
        yield weight
        yield judged
        yield served
        yield batches
        yield batched
        yield largest
        yield waited
        yield held
        yield lookups
        yield loads_done
        yield evicted
        yield by_model


#: For each timed runtime call: its histogram's label when it returns, when it raises, and when
#: it is cancelled (a start stopped or timed out, a check timed out).
_OUTCOMES = {
    "start": ("ready", "failed", "cancelled"),
    "adopt": ("adopted", "adoption_failed", "cancelled"),
    "check_health": ("ok", "failed", "timed_out"),
}


@final
class _LeadershipCollector(Collector):
    def __init__(self, leadership: Leadership):
        self._leadership = leadership

    def collect(self) -> Iterator[Metric]:
        lead = self._leadership
        seen = lead.seen
        yield GaugeMetricFamily(
            "controller_leader", "1 while this daemon leads, 0 while it stands by", lead.leading
        )
        yield GaugeMetricFamily(
            "controller_leader_epoch",
            "The epoch of the lease as this daemon last saw it (0: never claimed)",
            seen.epoch if seen is not None else 0,
        )
        for name, text, value in (
            ("controller_lease_renewals", "Renewals of the lease by this daemon", lead.renewals),
            (
                "controller_lease_renew_failures",
                "Renewals that failed (the store did not answer)",
                lead.renew_failures,
            ),
            (
                "controller_leadership_transitions",
                "Times this daemon began or stopped leading",
                lead.transitions,
            ),
            (
                "controller_fenced_refusals",
                "Commands of this daemon refused by the store or a replica as from a stale epoch",
                lead.refusals,
            ),
        ):
            yield CounterMetricFamily(name, text, value)


@final
class _TimedRuntime(RuntimeWrapper):
    """Times the starts, adoptions, drains and health checks of the runtime it wraps."""

    def __init__(self, inner: Runtime, metrics: Metrics):
        super().__init__(inner)
        self._metrics = metrics

    async def around(self, op: str, tag: str | None, work: Callable[[], Awaitable[T]]) -> T:
        if op not in _OUTCOMES and op != "drain":
            return await work()
        started = trio.current_time()
        outcome = 1  # failed, unless it returns or is cancelled
        try:
            result = await work()
            outcome = 0
            return result
        except trio.Cancelled:
            outcome = 2  # stopped, or timed out: not the replica's failure
            raise
        finally:
            elapsed = trio.current_time() - started
            if op == "drain":
                self._metrics.drains.observe(elapsed)
            else:
                label = _OUTCOMES[op][outcome]
                histogram = (
                    self._metrics.health_checks if op == "check_health" else self._metrics.starts
                )
                histogram.labels(label).observe(elapsed)

    async def check_health_replicas(self, tags: Sequence[str], report: CheckReport) -> None:
        # As ``around`` times one check, each check of the batch from the batch's start.
        started = trio.current_time()
        left = set(tags)
        checks = self._metrics.health_checks

        def timed(results: list[tuple[str, Exception | None]]) -> None:
            elapsed = trio.current_time() - started
            for tag, exc in results:
                left.discard(tag)
                checks.labels("ok" if exc is None else "failed").observe(elapsed)
            report(results)

        outcome = "failed"
        try:
            await self.inner_checks(tags, timed)
        except trio.Cancelled:
            outcome = "timed_out"
            raise
        finally:
            elapsed = trio.current_time() - started
            for _ in left:
                checks.labels(outcome).observe(elapsed)


@final
class _TimedStore(StoreWrapper):
    """Times the writes of the store it wraps."""

    def __init__(self, inner: Store, metrics: Metrics):
        super().__init__(inner)
        self._metrics = metrics

    async def around(self, op: str, keys: Sequence[str], work: Callable[[], Awaitable[T]]) -> T:
        started = trio.current_time()
        result = await work()
        if op == "write":
            self._metrics.checkpoint_writes.observe(trio.current_time() - started)
        return result
