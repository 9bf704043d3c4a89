"""What a multiplexed replica reports of its models with its load (``@controller.multiplexed``):
the models it holds and is loading, the requests each had, and its cache's counts. Read back
from a worker's (or an actor's) JSON, checked: a replica's code runs in the process that says
it, and a bad figure must not reach status or metrics."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

#: The most models one report may name, and count requests of.
MAX_REPORTED_MODELS = 10_000
#: A model's id: what a header value and a metric label can carry as it is.
MODEL_ID_RULE = "1 to 128 characters of letters, digits and . _ - : / @ + ="
MODEL_ID = re.compile(r"[A-Za-z0-9._:/@+=-]{1,128}")
#: Where a replica counts the requests of models past the first 1,000 it counted.
OTHER_MODELS = "(other)"
_COUNT_LIMIT = 1 << 63


@attrs.frozen
class Held:
    """What a replica holds (and is loading), as of its `generation`: what routers route by."""

    generation: int
    """Counts every change of its models: the newest word wins, whoever carried it."""
    capacity: int
    """Its ``max_models_per_replica``."""
    models: frozenset[str]
    """What it holds, those it is loading included."""
    loading: frozenset[str] = frozenset()
    """Those of `models` it is loading still."""

    @property
    def has_room(self) -> bool:
        return len(self.models) < self.capacity

    def header(self) -> bytes:
        """As a replica's answers say it: ``<generation> <capacity> <model> ...``, a model
        being loaded marked ``~`` (no model's id has one)."""
        named = [f"~{m}" if m in self.loading else m for m in sorted(self.models)]
        return " ".join([str(self.generation), str(self.capacity), *named]).encode("ascii")

    def with_model(self, model: str) -> Held:
        """As it will be once it starts loading `model` (a router's guess until the replica
        says)."""
        return Held(self.generation, self.capacity, self.models | {model}, self.loading | {model})


@attrs.frozen
class ReplicaModels:
    """One replica's models, as its latest load report said."""

    generation: int
    """Counts each change of its models."""
    capacity: int
    """Its ``max_models_per_replica``."""
    models: tuple[str, ...]
    """What it holds, and is loading, sorted."""
    requests: Mapping[str, int] = attrs.field(factory=dict)
    """Requests that named each model, since it started (past 1,000 models, the rest are
    counted under ``(other)``)."""
    hits: int = 0
    """Loads asked of a model it held."""
    misses: int = 0
    """Loads asked of a model it did not hold (which waited for a load)."""
    loads: int = 0
    evictions: int = 0

    @property
    def held(self) -> Held:
        return Held(self.generation, self.capacity, frozenset(self.models))

    def to_json(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "capacity": self.capacity,
            "models": list(self.models),
            "requests": dict(self.requests),
            "hits": self.hits,
            "misses": self.misses,
            "loads": self.loads,
            "evictions": self.evictions,
        }


def count_of(value: object) -> int | None:
    """`value` if it is a whole number an int64 holds, else None (a report's count)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _COUNT_LIMIT:
        return value
    return None


def parse_replica_models(value: object) -> ReplicaModels | None:
    """A report's ``models`` read back; None if it is not one (then nothing of it is kept)."""
    if not isinstance(value, Mapping):
        return None
    counts = [
        count_of(value.get(k))
        for k in ("generation", "capacity", "hits", "misses", "loads", "evictions")
    ]
    models, requests = value.get("models"), value.get("requests")
    if any(c is None for c in counts) or not isinstance(models, list | tuple):
        return None
    if not isinstance(requests, Mapping) or len(requests) > MAX_REPORTED_MODELS:
        return None
    if len(models) > MAX_REPORTED_MODELS or not all(
        isinstance(m, str) and MODEL_ID.fullmatch(m) for m in models
    ):
        return None
    kept: dict[str, int] = {}
    for model, count in requests.items():
        number = count_of(count)
        named = isinstance(model, str) and (model == OTHER_MODELS or MODEL_ID.fullmatch(model))
        if not named or number is None:
            return None
        kept[model] = number
    generation, capacity, hits, misses, loads, evictions = (c or 0 for c in counts)
    return ReplicaModels(
        generation,
        max(capacity, 1),
        tuple(sorted(set(models))),
        kept,
        hits,
        misses,
        loads,
        evictions,
    )
