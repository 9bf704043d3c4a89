"""A backend's ``canary`` block: a new revision takes a share of the traffic in steps, and is
judged against the stable revision on its own numbers before it replaces it.

With the block, a deploy that makes a revision of a new version first starts replicas of it
sized to the first step's weight, beside the stable revision at full strength, and the
ingresses send it that share. Each step lasts its ``pause_s``; the gates judge the canary's
errors and p99 latency against the stable revision's over the same step. Past the last step the
revision is promoted: the normal rolling update, under ``max_surge`` and ``max_unavailable``.
A failed gate aborts: the canary's weight goes to 0, its replicas are drained, and the backend
goes back to the stable revision. Without the block (None), rollouts are rolling updates.

Like ``autoscaling``, the block is not part of a revision: changing it restarts nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..values.errors import ConfigError
from ..values.fields import from_mapping
from ..values.names import NAME, NAME_PATTERN
from ..values.numbers import MAX_SECONDS, seconds, whole

_PREFIX = "BackendConfig.canary"
MAX_STEPS = 20
MAX_MIN_REQUESTS = 1_000_000_000
#: An HTTP header or cookie name: a token (RFC 9110), at most 64 characters.
TOKEN_PATTERN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}"
_TOKEN = re.compile(TOKEN_PATTERN)
#: Headers that say how a request is framed or carried, not who sends it: never a client's
#: key (a proxy may rewrite them), and Cookie has ``sticky_cookie``.
RESERVED_HEADERS = frozenset(
    {
        "connection",
        "content-length",
        "cookie",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


@attrs.frozen(kw_only=True)
class CanaryStep:
    """One step: the canary's share of the traffic, and how long it holds before a verdict."""

    weight: float
    """The percent of requests the canary revision serves (more than 0, less than 100)."""
    pause_s: float
    """How long the step lasts (its gates judge the numbers of that time)."""


def _step(i: int, value: object) -> CanaryStep:
    field = f"{_PREFIX}.steps[{i}]"
    if isinstance(value, CanaryStep):
        return value
    if not isinstance(value, Mapping) or set(value) != {"weight", "pause_s"}:
        raise ConfigError(field, "must be a table with exactly 'weight' and 'pause_s'", value)
    weight = value["weight"]
    if (
        isinstance(weight, bool)
        or not isinstance(weight, (int, float))
        or not 0 < weight < 100
        or not math.isfinite(weight)
    ):
        raise ConfigError(f"{field}.weight", "must be a percent above 0 and below 100", weight)
    return CanaryStep(
        weight=float(weight), pause_s=seconds(f"{field}.pause_s", value["pause_s"], allow_zero=True)
    )


def _steps(value: object) -> tuple[CanaryStep, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(f"{_PREFIX}.steps", "must be a list of {weight, pause_s} tables", value)
    if not 1 <= len(value) <= MAX_STEPS:
        raise ConfigError(f"{_PREFIX}.steps", f"must hold 1 to {MAX_STEPS} steps", len(value))
    steps = tuple(_step(i, item) for i, item in enumerate(value))
    for i in range(1, len(steps)):
        if steps[i].weight <= steps[i - 1].weight:
            raise ConfigError(
                f"{_PREFIX}.steps[{i}].weight",
                f"must be above the step before's ({steps[i - 1].weight:g}): weights only grow",
                steps[i].weight,
            )
    return steps


def _fraction(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigError(f"{_PREFIX}.{field}", "must be a fraction from 0.0 to 1.0", value)
    return float(value)


def _ratio(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 1000:
        raise ConfigError(f"{_PREFIX}.max_p99_ratio", "must be a number from 1 to 1000", value)
    return float(value)


def _slack(value: object) -> float:
    return seconds(f"{_PREFIX}.p99_slack_s", value, allow_zero=True)


def _min_requests(value: object) -> int:
    count = whole(value)
    if count is None or not 1 <= count <= MAX_MIN_REQUESTS:
        raise ConfigError(
            f"{_PREFIX}.min_requests", f"must be a whole number from 1 to {MAX_MIN_REQUESTS}", value
        )
    return count


def _follows(value: object) -> str | None:
    if value is None or (isinstance(value, str) and NAME.fullmatch(value)):
        return value
    raise ConfigError(f"{_PREFIX}.follows", "must be None or a backend's name", value)


def _token(field: str) -> Any:
    def check(value: object) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not _TOKEN.fullmatch(value):
            raise ConfigError(
                f"{_PREFIX}.{field}",
                "must be None or a header or cookie name: 1-64 letters, digits or !#$%&'*+.^_`|~-",
                value,
            )
        if field.endswith("header") and value.lower() in RESERVED_HEADERS:
            raise ConfigError(
                f"{_PREFIX}.{field}",
                "must not be a header that frames or carries the request "
                f"({', '.join(sorted(RESERVED_HEADERS))}; for a cookie, sticky_cookie)",
                value,
            )
        return value.lower() if field.endswith("header") else value

    return check


_TOKEN_SCHEMA = {"type": ["string", "null"], "pattern": f"^{TOKEN_PATTERN}$"}
_STEP_SCHEMA = {
    "type": "object",
    "properties": {
        "weight": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 100},
        "pause_s": {"type": "number", "minimum": 0, "maximum": MAX_SECONDS},
    },
    "required": ["weight", "pause_s"],
    "additionalProperties": False,
}


def _field(converter: Any, schema: dict[str, Any], default: Any) -> Any:
    return attrs.field(default=default, converter=converter, metadata={"schema": schema})


DEFAULT_STEPS = (
    CanaryStep(weight=5.0, pause_s=60.0),
    CanaryStep(weight=25.0, pause_s=120.0),
    CanaryStep(weight=50.0, pause_s=120.0),
)


@attrs.frozen(kw_only=True)
class CanaryConfig:
    """How a new revision is tried on part of the traffic before it replaces the stable one."""

    steps: tuple[CanaryStep, ...] = _field(
        _steps,
        {"type": "array", "minItems": 1, "maxItems": MAX_STEPS, "items": _STEP_SCHEMA},
        DEFAULT_STEPS,
    )
    """The canary's share in steps, e.g. ``[{weight = 5, pause_s = 60}, {weight = 25, pause_s =
    120}]``; weights only grow, each above 0 and below 100. After the last, 100: promotion."""

    max_error_rate_increase: float = _field(
        lambda v: _fraction("max_error_rate_increase", v),
        {"type": "number", "minimum": 0, "maximum": 1},
        0.01,
    )
    """The error gate: the canary's share of 5xx answers (and requests that could not be
    proxied) may be at most the stable revision's plus this (0.01: one point)."""

    max_p99_ratio: float = _field(_ratio, {"type": "number", "minimum": 1, "maximum": 1000}, 1.5)
    """The latency gate: the canary's p99 may be at most this times the stable revision's..."""

    p99_slack_s: float = _field(
        _slack, {"type": "number", "minimum": 0, "maximum": MAX_SECONDS}, 0.01
    )
    """...or at most this many seconds above it, whichever is more (so that 1 ms against
    0.5 ms fails no release)."""

    min_requests: int = _field(
        _min_requests, {"type": "integer", "minimum": 1, "maximum": MAX_MIN_REQUESTS}, 100
    )
    """Requests each revision must have answered in a step before the gates judge it; a step
    whose pause has ended waits for them (within ``progress_deadline_s``)."""

    sticky_header: str | None = _field(_token("sticky_header"), _TOKEN_SCHEMA, None)
    """A request header (e.g. ``X-User``) whose value keeps a client on one revision: a hash of
    it picks the revision, so a client stays where it was as the weight grows."""

    sticky_cookie: str | None = _field(_token("sticky_cookie"), _TOKEN_SCHEMA, None)
    """A cookie whose value does the same (the header, if both are given and sent, wins)."""

    force_header: str | None = _field(_token("force_header"), _TOKEN_SCHEMA, None)
    """A request header (e.g. ``X-Revision``) whose value ``canary`` or ``stable`` sends the
    request to that revision, for testing. Off by default: anyone who can reach the ingress
    could use it."""

    follows: str | None = _field(
        _follows, {"type": ["string", "null"], "pattern": f"^{NAME_PATTERN}$"}, None
    )
    """Another backend whose canary this one's verdict follows while that one is judged (an
    application sets its entry here for its other members): the steps go on at their pauses
    without waiting for requests of their own (a backend only other backends call has none
    the gates can read), and the last step waits for that backend's verdict, which its
    application carries over. Its own gates still abort it on the requests it has, and a
    crash of a replica still does. While that backend is in no canary (or follows another
    itself), this one is judged on its own numbers."""

    def __attrs_post_init__(self) -> None:
        if self.force_header is not None and self.force_header == self.sticky_header:
            raise ConfigError(
                f"{_PREFIX}.force_header",
                "must not be sticky_header too: one header cannot both force and hash",
                self.force_header,
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> CanaryConfig:
        return from_mapping(cls, data, _PREFIX)


def canary(value: object) -> CanaryConfig | None:
    """BackendConfig.canary's converter: None, a config, or a mapping of its fields."""
    if value is None or isinstance(value, CanaryConfig):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(_PREFIX, "must be a table of canary fields, or none", value)
    return CanaryConfig.from_dict(value)


def canary_schema() -> dict[str, Any]:
    """The block as JSON Schema, for the API's document."""
    fields = attrs.fields(CanaryConfig)
    return {
        "type": ["object", "null"],
        "properties": {f.name: f.metadata["schema"] for f in fields},
        "additionalProperties": False,
        "description": "Canary releases: a new revision takes a share of the traffic in steps "
        "and is judged on its own numbers; beyond what JSON Schema can say, step weights must "
        "grow, force_header must not be sticky_header, and neither may be a header that "
        "frames or carries the request (422 otherwise)",
    }


def canary_dict(config: CanaryConfig) -> dict[str, Any]:
    """The block as JSON data."""
    out = attrs.asdict(config, recurse=False)
    out["steps"] = [{"weight": s.weight, "pause_s": s.pause_s} for s in config.steps]
    return out


def canary_count(num_replicas: int, weight: float) -> int:
    """Replicas of the canary for `weight` percent of a backend of `num_replicas`: its share,
    rounded up, at least one (a backend scaled to 0 has no canary either)."""
    if num_replicas <= 0:
        return 0
    return max(1, min(num_replicas, math.ceil(num_replicas * weight / 100 - 1e-9)))
