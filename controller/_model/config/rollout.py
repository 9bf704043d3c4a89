"""The fields of a backend's config that steer its rollouts: how far an update may go above and
below the count, the progress deadline, what a failed rollout does, how long a new replica must
stay healthy, how many revisions are kept.

None of them is part of a revision (they say how the controller rolls replicas out, not what the
replicas run): changing them creates no revision and restarts nothing, and an undo keeps them.
"""

from __future__ import annotations

from typing import Any, Literal

from ..values.errors import ConfigError
from ..values.numbers import MAX_COUNT, finite, seconds, whole

#: What a failed rollout does: stop where it is and keep what serves, or undo to the last
#: revision that completed.
OnFailure = Literal["halt", "rollback"]
ON_FAILURE: tuple[OnFailure, ...] = ("halt", "rollback")
#: The most revisions a backend may keep beyond those it must (a hundred is a long history; the
#: whole history is one store record, written with each revision).
MAX_HISTORY = 100

#: Either limit as JSON Schema, for the API's document.
LIMIT_SCHEMA: dict[str, Any] = {
    "description": "a count of replicas (a whole number), or a fraction of num_replicas "
    "(a number from 0 to 1 written with a decimal point: 1 is one replica, 1.0 is all of them)",
    "anyOf": [
        {"type": "integer", "minimum": 0, "maximum": MAX_COUNT},
        {"type": "number", "minimum": 0, "maximum": 1},
    ],
}


def _limit(field: str, value: object) -> int | float:
    # An int is a count of replicas; a float is a fraction of num_replicas (as Kubernetes'
    # "25%"), so 1 and 1.0 mean different things, and both survive a JSON round trip.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, "must be a count (int >= 0) or a fraction (float 0.0-1.0)", value)
    if isinstance(value, int):
        if not 0 <= value <= MAX_COUNT:
            raise ConfigError(field, f"a count must be from 0 to {MAX_COUNT}", value)
        return value
    fraction = finite(value)
    if fraction is not None and fraction > 1.0 and fraction.is_integer():
        # JSON (and so the API's schema) cannot tell 2.0 from 2: above 1 it can only be a count.
        if fraction > MAX_COUNT:
            raise ConfigError(field, f"a count must be from 0 to {MAX_COUNT}", value)
        return int(fraction)
    if fraction is None or not 0.0 <= fraction <= 1.0:
        raise ConfigError(field, "a fraction must be between 0.0 and 1.0", value)
    return value


def max_surge(value: object) -> int | float:
    return _limit("BackendConfig.max_surge", value)


def max_unavailable(value: object) -> int | float:
    return _limit("BackendConfig.max_unavailable", value)


def progress_deadline(value: object) -> float:
    return seconds("BackendConfig.progress_deadline_s", value, allow_zero=False)


def min_ready(value: object) -> float:
    return seconds("BackendConfig.min_ready_s", value, allow_zero=True)


def on_failure(value: object) -> OnFailure:
    for choice in ON_FAILURE:
        if value == choice and isinstance(value, str):
            return choice
    raise ConfigError("BackendConfig.on_failure", 'must be "halt" or "rollback"', value)


def history_limit(value: object) -> int:
    count = whole(value)
    if count is None or not 0 <= count <= MAX_HISTORY:
        raise ConfigError(
            "BackendConfig.revision_history_limit",
            f"must be a whole number from 0 to {MAX_HISTORY}",
            value,
        )
    return count
