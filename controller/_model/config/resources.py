"""The ``resources`` field of a backend's config: what one replica reserves on its runtime, by
resource name, bounded so that placement's fixed-point arithmetic cannot overflow."""

from __future__ import annotations

from collections.abc import Mapping

from ..values.errors import ConfigError
from ..values.numbers import finite

#: The most of one resource a replica may ask for: more is a typo, and would overflow placement's
#: fixed-point arithmetic.
MAX_RESOURCE = 1e15


def resources(value: object) -> dict[str, float]:
    field = "BackendConfig.resources"
    if not isinstance(value, Mapping):
        raise ConfigError(
            field, 'must be a mapping of resource name to amount, e.g. {"CPU": 1}', value
        )
    out: dict[str, float] = {}
    for key, amount in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(field, "resource names are non-empty strings", key)
        number = (
            None
            if isinstance(amount, bool) or not isinstance(amount, (int, float))
            else finite(amount)
        )
        if number is None or not 0 <= number <= MAX_RESOURCE:
            raise ConfigError(
                f"{field}[{key!r}]", f"must be a finite number from 0 to {MAX_RESOURCE:g}", amount
            )
        out[key] = number
    return out
