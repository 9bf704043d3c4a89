"""The fields of a backend's config that steer its rollouts: the progress deadline, what a
failed rollout does, how long a new replica must stay healthy, how many revisions are kept.

None of them is part of a revision (they say how the controller rolls replicas out, not what the
replicas run): changing them creates no revision and restarts nothing, and an undo keeps them.
"""

from __future__ import annotations

from typing import Literal

from .errors import ConfigError
from .numbers import seconds, whole

#: What a failed rollout does: stop where it is and keep what serves, or undo to the last
#: revision that completed.
OnFailure = Literal["halt", "rollback"]
ON_FAILURE: tuple[OnFailure, ...] = ("halt", "rollback")
#: The most revisions a backend may keep beyond those it must (a hundred is a long history; the
#: whole history is one store record, written with each revision).
MAX_HISTORY = 100


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
