"""A backend's load book: the latest load report of each source (an ingress), for status,
metrics and (later) the autoscaler. Written by the controller as reports arrive; read lazily,
so a source that goes quiet simply stops counting once its report is `LOAD_TTL_S` old."""

from __future__ import annotations

import collections
from typing import final

import attrs

from ._state import LOAD_TTL_S, BackendLoad, LoadReport

#: Sources kept per backend: more are dropped oldest first (a buggy router that makes up a
#: new id per report must not grow memory).
MAX_SOURCES = 256


@final
@attrs.define(eq=False)
class LoadBook:
    """Latest report per source, oldest first, with the trio time it arrived."""

    _reports: collections.OrderedDict[str, tuple[float, LoadReport]] = attrs.field(
        factory=collections.OrderedDict, init=False
    )

    def take(self, report: LoadReport, now: float) -> bool:
        """Keep `report` as its source's latest; whether it changed what the book says."""
        before = self._reports.pop(report.source, None)
        self._reports[report.source] = (now, report)
        while len(self._reports) > MAX_SOURCES:
            self._reports.popitem(last=False)
        return before is None or before[1] != report

    def load(self, now: float) -> BackendLoad:
        """The sum of the reports younger than `LOAD_TTL_S`."""
        in_flight = queued = sources = 0
        replicas: dict[str, int] = {}
        for at, report in self._reports.values():
            if now - at > LOAD_TTL_S:
                continue
            sources += 1
            queued += report.queued
            for tag, count in report.in_flight.items():
                if count:
                    replicas[tag] = replicas.get(tag, 0) + count
                    in_flight += count
        return BackendLoad(in_flight, queued, replicas, sources)
