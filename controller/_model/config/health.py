"""The fields of a backend's config that check its replicas' health: how often, how long one
check may take, and how many failures in a row replace a replica."""

from __future__ import annotations

from ..values.errors import ConfigError
from ..values.numbers import MAX_COUNT, seconds, whole

#: The shortest health-check period: checks more often than this cost the controller and the
#: replicas real CPU and tell nothing a 100 ms period would not.
MIN_HEALTH_CHECK_PERIOD_S = 0.1


def health_check_period(value: object) -> float:
    field = "BackendConfig.health_check_period_s"
    period = seconds(field, value, allow_zero=True)
    if 0 < period < MIN_HEALTH_CHECK_PERIOD_S:
        raise ConfigError(
            field, f"must be 0 (off) or at least {MIN_HEALTH_CHECK_PERIOD_S:g}", value
        )
    return period


def health_check_timeout(value: object) -> float:
    return seconds("BackendConfig.health_check_timeout_s", value, allow_zero=False)


def failure_threshold(value: object) -> int:
    count = whole(value)
    if count is None or not 1 <= count <= MAX_COUNT:
        raise ConfigError(
            "BackendConfig.health_check_failure_threshold",
            f"must be a whole number from 1 to {MAX_COUNT}",
            value,
        )
    return count
