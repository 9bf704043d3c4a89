"""How the controller backs off after failures: one policy for the whole controller."""

from __future__ import annotations

import random
from typing import Any

import attrs

from ..values.errors import ConfigError


def _non_negative(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    if not value >= 0:
        raise ConfigError(f"RestartPolicy.{attr.name}", "must be >= 0", value)


@attrs.frozen(kw_only=True)
class RestartPolicy:
    """Exponential backoff with jitter for replica restarts after failed starts and crashes.

    After the k-th consecutive failure of a backend, its next start waits
    ``min(max_delay_s, initial_delay_s * multiplier ** (k - 1))``, shortened by up to `jitter`
    (a fraction) at random so that many backends do not retry in step. A backend with no failure
    for `reset_after_s` starts again from `initial_delay_s`. After `max_failed_starts` failed starts
    in a row with no replica of the new version becoming ready, the deploy fails.
    """

    initial_delay_s: float = attrs.field(default=1.0, validator=_non_negative)
    """The wait after the first failure."""
    max_delay_s: float = attrs.field(default=60.0, validator=_non_negative)
    """The cap on the wait."""
    multiplier: float = attrs.field(default=2.0, validator=_non_negative)
    """How much longer each wait is than the one before."""
    jitter: float = attrs.field(default=0.2, validator=_non_negative)
    """Each wait is shortened by a random fraction up to this (0: exact waits)."""
    reset_after_s: float = attrs.field(default=60.0, validator=_non_negative)
    """A backend with no failure for this long is forgiven its earlier ones."""
    max_failed_starts: int = attrs.field(default=3, validator=_non_negative)
    """Failed starts in a row, with no replica of the new version ready, that fail the deploy."""

    def delay(self, failures: int, rng: random.Random) -> float:
        """The wait before the next start after `failures` consecutive failures (>= 1)."""
        base = min(self.max_delay_s, self.initial_delay_s * self.multiplier ** (failures - 1))
        return base * (1.0 - self.jitter * rng.random())
