"""Number checks shared by the configs: whole counts, finite floats, seconds in range."""

from __future__ import annotations

import math

from .errors import ConfigError

#: The longest timeout or period, in seconds (about 31 years): longer is a typo. A bound that a
#: double holds exactly, so that the document's check and the model's agree at the edge.
MAX_SECONDS = 1e9


def whole(value: object) -> int | None:
    """`value` as an int if it is a whole number: 3, or 3.0 (JSON does not tell them apart)."""
    # bool is an int subclass, but `num_replicas=True` is a bug, not a count.
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) else None


def finite(value: int | float) -> float | None:
    """`value` as a float, or None if it is not finite (an int too large for a float too)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def seconds(field: str, value: object, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, "must be a number of seconds", value)
    # Compared as given (an int past a double's range included), converted once in range.
    if not 0 <= value <= MAX_SECONDS or (value == 0 and not allow_zero):
        rule = ">= 0" if allow_zero else "> 0"
        raise ConfigError(
            field, f"must be a finite number of seconds {rule} and at most {MAX_SECONDS:g}", value
        )
    return float(value)


#: The largest count a config takes: replicas, a rollout's limits, a health-check threshold.
#: Larger ones mean nothing more, and would pass a bound on no arithmetic downstream.
MAX_COUNT = 1_000_000
