"""What a replica's served code reports with its load beyond the requests it holds: its models
(``@controller.multiplexed``) and its batches (``@controller.batch``). Read back from a
worker's (or an actor's) JSON, checked: the replica's own code runs in the process that says
it, and a bad figure must not reach status or metrics."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

from .multiplexing import ReplicaModels, count_of, parse_replica_models

#: The most batched functions one report may name.
MAX_BATCHERS = 100
_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_.<>]{0,199}")


@attrs.frozen
class BatchNumbers:
    """One batched function's batches on one replica, since it started."""

    function: str
    """Its qualified name (``Scorer.predict``)."""
    batches: int
    items: int
    """Items in all its batches: ``items / batches`` is the mean size."""
    largest: int
    waited_s: float
    """The time its batches waited, each from its first item's arrival to its run, summed:
    ``waited_s / batches`` is the mean wait."""

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class CodeReport:
    models: ReplicaModels | None = None
    batches: tuple[BatchNumbers, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The keys a load message carries (none if there is nothing to say)."""
        out: dict[str, Any] = {}
        if self.models is not None:
            out["models"] = self.models.to_json()
        if self.batches:
            out["batches"] = [b.to_json() for b in self.batches]
        return out


def _batch(value: object) -> BatchNumbers | None:
    if not isinstance(value, Mapping):
        return None
    function, waited = value.get("function"), value.get("waited_s")
    counts = [count_of(value.get(k)) for k in ("batches", "items", "largest")]
    if not isinstance(function, str) or _FUNCTION.fullmatch(function) is None:
        return None
    if not isinstance(waited, int | float) or isinstance(waited, bool):
        return None
    if not math.isfinite(waited) or waited < 0 or any(c is None for c in counts):
        return None
    batches, items, largest = (c or 0 for c in counts)
    return BatchNumbers(function, batches, items, largest, float(waited))


def parse_code_report(message: Mapping[str, Any]) -> CodeReport | None:
    """The ``models`` and ``batches`` of a load message, each read back checked (one that
    cannot be read is left out); None if it carries neither."""
    models = parse_replica_models(message.get("models"))
    given = message.get("batches")
    batches: tuple[BatchNumbers, ...] = ()
    if isinstance(given, list) and len(given) <= MAX_BATCHERS:
        read = [_batch(b) for b in given]
        batches = tuple(b for b in read if b is not None)
    if models is None and not batches:
        return None
    return CodeReport(models, batches)
