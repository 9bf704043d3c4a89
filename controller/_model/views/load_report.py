"""Load reports as JSON, for ``POST /api/v1/load``: how a remote ingress tells the daemon what
it sends to each replica and holds in its queues. Checked in full before any is taken."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..config.config import NAME_PATTERN
from ..decisions.verdict import RequestTally, tally_from_json
from .status import LoadReport

#: A source id: what ``Ingress`` makes (``ingress-<host>-<pid>-<hex>``) or any short plain word.
SOURCE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
MAX_LOAD_BACKENDS = 10_000
MAX_LOAD_REPLICAS = 100_000
MAX_LOAD_COUNT = 2**31 - 1
#: A canary release has two revisions; a report may name a few more (one just superseded).
MAX_TRAFFIC_VERSIONS = 8
_SOURCE = re.compile(SOURCE_PATTERN)
_NAME = re.compile(NAME_PATTERN)
#: A replica's version: a config's (1-200 printable ASCII) with a restart's ``+restart.N``.
_VERSION = re.compile(r"[\x20-\x7e]{1,240}")
VERSION_RULE = "1-240 printable ASCII characters"


def load_body(source: str, reports: list[LoadReport]) -> dict[str, Any]:
    """The body of one ``POST /api/v1/load`` carrying `reports` (all from `source`)."""
    return {
        "source": source,
        "backends": {r.backend: _one(r) for r in reports},
    }


def _one(report: LoadReport) -> dict[str, Any]:
    out: dict[str, Any] = {"in_flight": dict(report.in_flight), "queued": report.queued}
    if report.traffic:
        out["traffic"] = {v: tally.to_json() for v, tally in report.traffic.items()}
    return out


def parse_load_body(data: object) -> list[LoadReport]:
    """The reports a body carries; ``ValueError`` naming every fault (nothing is taken then)."""
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise ValueError("the body must be an object with 'source' and 'backends'")
    unknown = sorted(set(data) - {"source", "backends"})
    if unknown:
        problems.append(f"unknown fields: {', '.join(unknown)}")
    source = data.get("source")
    if not isinstance(source, str) or not _SOURCE.fullmatch(source):
        problems.append(
            "source: must be 1-128 letters, digits or '_.:-', starting with a letter or digit"
        )
    backends = data.get("backends")
    if not isinstance(backends, Mapping) or len(backends) > MAX_LOAD_BACKENDS:
        problems.append(f"backends: must be an object of at most {MAX_LOAD_BACKENDS} backends")
        backends = {}
    reports: list[LoadReport] = []
    for name, load in backends.items():
        report = _parse_one(str(source), name, load, problems)
        if report is not None:
            reports.append(report)
    if problems:
        raise ValueError("; ".join(problems))
    return reports


def _count(value: object) -> int | None:
    """`value` as a count, if it is one (``3`` or ``3.0``: JSON does not tell them apart)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if 0 <= value <= MAX_LOAD_COUNT else None


def _parse_one(source: str, name: object, load: object, problems: list[str]) -> LoadReport | None:
    label = f"backends[{name!r}]"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problems.append(f"{label}: not a backend name")
        return None
    if not isinstance(load, Mapping) or set(load) - {"traffic"} != {"in_flight", "queued"}:
        problems.append(
            f"{label}: must be an object with exactly 'in_flight' and 'queued' (and, during "
            "a canary release, 'traffic')"
        )
        return None
    traffic = _traffic(label, load.get("traffic", {}), problems)
    if traffic is None:
        return None
    in_flight, queued = load["in_flight"], _count(load["queued"])
    if queued is None:
        problems.append(f"{label}.queued: must be a whole number from 0 to {MAX_LOAD_COUNT}")
        return None
    counts = (
        {tag: _count(n) for tag, n in in_flight.items()}
        if isinstance(in_flight, Mapping) and len(in_flight) <= MAX_LOAD_REPLICAS
        else {"": None}
    )
    if not all(isinstance(tag, str) and n is not None for tag, n in counts.items()):
        problems.append(
            f"{label}.in_flight: must map at most {MAX_LOAD_REPLICAS} replica tags to whole "
            f"numbers from 0 to {MAX_LOAD_COUNT}"
        )
        return None
    in_flight_counts = {str(t): n for t, n in counts.items() if n}
    return LoadReport(source, name, in_flight_counts, queued, traffic=traffic)


def _traffic(label: str, value: object, problems: list[str]) -> dict[str, RequestTally] | None:
    """A report's numbers per revision (by replica version), or None after noting the fault."""
    if not isinstance(value, Mapping) or len(value) > MAX_TRAFFIC_VERSIONS:
        problems.append(
            f"{label}.traffic: must map at most {MAX_TRAFFIC_VERSIONS} replica versions to "
            "{requests, errors, buckets}"
        )
        return None
    out: dict[str, RequestTally] = {}
    for version, numbers in value.items():
        if not isinstance(version, str) or not _VERSION.fullmatch(version):
            problems.append(f"{label}.traffic: its keys must be replica versions ({VERSION_RULE})")
            return None
        try:
            out[str(version)] = tally_from_json(numbers)
        except ValueError as exc:
            problems.append(f"{label}.traffic[{str(version)[:64]!r}]: {exc}")
            return None
    return out
