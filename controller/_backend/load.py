"""A backend's load book: the latest load report of each source (an ingress), for status,
metrics and the autoscaler. Written by the controller as reports arrive; read lazily,
so a source that goes quiet simply stops counting once its report is `LOAD_TTL_S` old."""

from __future__ import annotations

import collections
from typing import final

import attrs

from .._model.records.code_report import BatchNumbers, CodeReport
from .._model.records.multiplexing import ReplicaModels
from .._model.views.status import LOAD_TTL_S, BackendLoad, LoadReport

#: Sources kept per backend: more are dropped oldest first (a buggy router that makes up a
#: new id per report must not grow memory).
MAX_SOURCES = 256


@final
@attrs.define(eq=False)
class LoadBook:
    """Latest report per source, oldest first, with the trio time it arrived."""

    _reports: collections.OrderedDict[str, tuple[float, LoadReport, int]] = attrs.field(
        factory=collections.OrderedDict, init=False
    )
    _own: dict[str, int] = attrs.field(factory=dict, init=False)
    """What replicas report of themselves (their ``load()``), by tag, while they live."""
    _own_total: int = attrs.field(default=0, init=False)
    _served: dict[str, int] = attrs.field(factory=dict, init=False)
    """The requests each live replica says it has answered (code the worker serves)."""
    _models: dict[str, ReplicaModels] = attrs.field(factory=dict, init=False)
    """What each live multiplexed replica says of its models."""
    _batches: dict[str, tuple[BatchNumbers, ...]] = attrs.field(factory=dict, init=False)
    """What each live replica with batched functions says of their batches."""

    def take(self, report: LoadReport, now: float) -> bool:
        """Keep `report` as its source's latest; whether it changed what the book says."""
        before = self._reports.pop(report.source, None)
        # Summed once here: the autoscaler reads the totals on every pass.
        total = sum(report.in_flight.values())
        self._reports[report.source] = (now, report, total)
        while len(self._reports) > MAX_SOURCES:
            self._reports.popitem(last=False)
        return before is None or before[1] != report

    def take_own(self, tag: str, ongoing: int) -> bool:
        """Keep what replica `tag` says of its own load; whether that changed anything."""
        before = self._own.get(tag)
        self._own[tag] = ongoing
        self._own_total += ongoing - (before or 0)
        return before != ongoing

    def take_code(self, tag: str, code: CodeReport) -> None:
        """Keep what replica `tag` says of its code's models and batches."""
        if code.models is not None:
            self._models[tag] = code.models
        if code.batches:
            self._batches[tag] = code.batches

    def take_served(self, tag: str, served: int) -> None:
        """Keep the count of requests replica `tag` says it has answered (a count no int64
        holds is a replica's bug, and is not kept)."""
        if 0 <= served < 1 << 63:
            self._served[tag] = served

    def forget_own(self, tag: str) -> bool:
        """Replica `tag` is gone, or no longer says: what it said no longer counts."""
        self._served.pop(tag, None)
        self._models.pop(tag, None)
        self._batches.pop(tag, None)
        before = self._own.pop(tag, None)
        self._own_total -= before or 0
        return before is not None

    def ongoing(self, now: float) -> int | None:
        """In flight plus queued: what the ingresses reported within `LOAD_TTL_S` sent to the
        replicas, or what the replicas say of themselves, whichever is more (they count the same
        requests when both speak), plus what the ingresses hold queued. None if no one reports
        (no signal, which is not the same as no load)."""
        in_flight = queued = sources = 0
        for at, report, sent in self._reports.values():
            if now - at <= LOAD_TTL_S:
                in_flight += sent
                queued += report.queued
                sources += 1
        if not sources and not self._own:
            return None
        return max(in_flight, self._own_total) + queued

    def load(self, now: float) -> BackendLoad:
        """The sum of the reports younger than `LOAD_TTL_S`."""
        in_flight = queued = sources = 0
        replicas: dict[str, int] = {}
        for at, report, _ in self._reports.values():
            if now - at > LOAD_TTL_S:
                continue
            sources += 1
            queued += report.queued
            for tag, count in report.in_flight.items():
                if count:
                    replicas[tag] = replicas.get(tag, 0) + count
                    in_flight += count
        return BackendLoad(
            in_flight,
            queued,
            replicas,
            sources,
            self._own_total,
            dict(self._served),
            dict(self._models),
            dict(self._batches),
        )
