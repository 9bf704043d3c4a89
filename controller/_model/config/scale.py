"""A scale: a backend's config with a new count and nothing else changed (``kubectl scale``)."""

from __future__ import annotations

import attrs

from ..values.errors import ConfigError
from ..values.numbers import whole
from .config import MAX_REPLICAS, BackendConfig


def scaled(
    config: BackendConfig,
    replicas: int | None = None,
    *,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
) -> BackendConfig:
    """`config` with a new count and nothing else changed: `replicas` for a fixed backend,
    `min_replicas` and `max_replicas` (either, or both) for an autoscaled one. A count that does
    not fit the backend is a ``ConfigError`` naming it."""
    if config.autoscaling is None:
        if min_replicas is not None or max_replicas is not None:
            field = "min_replicas" if min_replicas is not None else "max_replicas"
            raise ConfigError(
                field, "the backend is not autoscaled: scale it by replicas", show_value=False
            )
        if replicas is None:
            raise ConfigError("replicas", "is needed (a whole number from 0)", show_value=False)
        return attrs.evolve(config, num_replicas=_scale_count("replicas", replicas))
    if replicas is not None:
        raise ConfigError(
            "replicas",
            "the backend is autoscaled: scale it by min_replicas and max_replicas",
            replicas,
        )
    if min_replicas is None and max_replicas is None:
        raise ConfigError(
            "min_replicas", "min_replicas or max_replicas is needed", show_value=False
        )
    bounds: dict[str, int] = {}
    if min_replicas is not None:
        bounds["min_replicas"] = _scale_count("min_replicas", min_replicas)
    if max_replicas is not None:
        bounds["max_replicas"] = _scale_count("max_replicas", max_replicas)
    return attrs.evolve(config, autoscaling=attrs.evolve(config.autoscaling, **bounds))


def _scale_count(field: str, value: object) -> int:
    count = whole(value)
    if count is None or not 0 <= count <= MAX_REPLICAS:
        raise ConfigError(field, f"must be a whole number from 0 to {MAX_REPLICAS}", value)
    return count
