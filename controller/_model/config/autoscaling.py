"""A backend's ``autoscaling`` block: the bounds, the target load and the pace of changes.

The semantics are Kubernetes HPA's (ratio form, tolerance, stabilization windows, rate limits
per direction with HPA's defaults), on ongoing requests per replica; ``autoscale`` decides.
Every rule is written once more as JSON Schema for the API's document, but one: `min_replicas`
<= `max_replicas` ties two numbers, which JSON Schema cannot say.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from ..values.errors import ConfigError
from ..values.fields import unknown_field

_PREFIX = "BackendConfig.autoscaling"
#: The most replicas an autoscaled backend may reach, as for num_replicas.
MAX_REPLICAS = 1_000_000
#: The longest stabilization window or rate-limit period (an hour, as HPA's): the autoscaler
#: keeps what it recommended within the window, so the window bounds its memory.
MAX_WINDOW_S = 3600.0
#: The longest scale-to-zero delay (a day); longer is a typo.
MAX_ZERO_DELAY_S = 86400.0
#: The largest target per replica, as max_ongoing_requests, and the smallest: a target of a
#: hundredth of a request is already a hundred replicas per request in flight.
MAX_TARGET = 1_000_000.0
MIN_TARGET = 0.01


def _count(field: str, value: object, lowest: int = 0) -> int:
    count = (
        None
        if isinstance(value, bool)
        else int(value)
        if isinstance(value, float) and value.is_integer()
        else value
    )
    if not isinstance(count, int) or not lowest <= count <= MAX_REPLICAS:
        raise ConfigError(
            f"{_PREFIX}.{field}", f"must be a whole number from {lowest} to {MAX_REPLICAS}", value
        )
    return count


def _number(field: str, value: object, low: float, high: float, *, open_low: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{_PREFIX}.{field}", "must be a number", value)
    # Compared as given (an int past a double's range included), converted once in range.
    if not low <= value <= high or (open_low and value == low):
        rule = f"> {low:g}" if open_low else f">= {low:g}"
        raise ConfigError(f"{_PREFIX}.{field}", f"must be {rule} and at most {high:g}", value)
    return float(value)


def _field(converter: Any, schema: dict[str, Any], default: Any = attrs.NOTHING) -> Any:
    return attrs.field(default=default, converter=converter, metadata={"schema": schema})


def _window(name: str) -> Any:
    return lambda v: _number(name, v, 0, MAX_WINDOW_S, open_low=False)


def _period(name: str) -> Any:
    return lambda v: _number(name, v, 0, MAX_WINDOW_S, open_low=True)


_WINDOW = {"type": "number", "minimum": 0, "maximum": MAX_WINDOW_S}
_PERIOD = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_WINDOW_S}
_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_REPLICAS}


@attrs.frozen(kw_only=True)
class AutoscalingConfig:
    """Scale a backend between `min_replicas` and `max_replicas` on the requests its replicas
    have ongoing (in flight plus queued at the ingress), toward `target_ongoing_requests` each.
    With it, the backend's `num_replicas` is only the count it starts with (put within the
    bounds); a deploy that changes only this block never restarts replicas."""

    max_replicas: int = _field(lambda v: _count("max_replicas", v, 1), {**_COUNT, "minimum": 1})
    """The most replicas it scales to (required)."""

    min_replicas: int = _field(lambda v: _count("min_replicas", v), _COUNT, 1)
    """The fewest replicas it keeps; 0 lets it scale to zero after `scale_to_zero_delay_s`
    without a request, and back up on the first one (the ingress holds it meanwhile)."""

    target_ongoing_requests: float = _field(
        lambda v: _number("target_ongoing_requests", v, MIN_TARGET, MAX_TARGET, open_low=False),
        {"type": "number", "minimum": MIN_TARGET, "maximum": MAX_TARGET},
        2.0,
    )
    """The requests each replica should have ongoing: the backend wants
    ceil(ongoing / target) replicas."""

    tolerance: float = _field(
        lambda v: _number("tolerance", v, 0, 0.99, open_low=False),
        {"type": "number", "minimum": 0, "maximum": 0.99},
        0.1,
    )
    """No change while the load per replica is within this fraction of the target (HPA's)."""

    upscale_stabilization_s: float = _field(_window("upscale_stabilization_s"), _WINDOW, 0.0)
    """A scale-up follows the lowest count recommended within this window: 0 acts at once."""

    downscale_stabilization_s: float = _field(_window("downscale_stabilization_s"), _WINDOW, 300.0)
    """A scale-down follows the highest count recommended within this window, so that one
    quiet moment never scales down."""

    scale_up_percent: float = _field(
        lambda v: _number("scale_up_percent", v, 0, 10000, open_low=False),
        {"type": "number", "minimum": 0, "maximum": 10000},
        100.0,
    )
    """Within `scale_up_period_s`, grow by at most this percent of the count at the period's
    start, or by `scale_up_replicas`, whichever is more (HPA's default: 100 % or 4)."""

    scale_up_replicas: int = _field(lambda v: _count("scale_up_replicas", v), _COUNT, 4)
    """See `scale_up_percent`."""

    scale_up_period_s: float = _field(_period("scale_up_period_s"), _PERIOD, 15.0)
    """The period of the scale-up limit."""

    scale_down_percent: float = _field(
        lambda v: _number("scale_down_percent", v, 0, 100, open_low=False),
        {"type": "number", "minimum": 0, "maximum": 100},
        100.0,
    )
    """Within `scale_down_period_s`, shrink by at most this percent of the count at the
    period's start (HPA's default: 100 %); 0 never scales down."""

    scale_down_period_s: float = _field(_period("scale_down_period_s"), _PERIOD, 15.0)
    """The period of the scale-down limit."""

    scale_to_zero_delay_s: float = _field(
        lambda v: _number("scale_to_zero_delay_s", v, 0, MAX_ZERO_DELAY_S, open_low=False),
        {"type": "number", "minimum": 0, "maximum": MAX_ZERO_DELAY_S},
        300.0,
    )
    """With `min_replicas` 0: how long the backend must have had no request at all before its
    last replica goes (separate from the downscale window, which governs down to 1)."""

    def __attrs_post_init__(self) -> None:
        for problem in _across(attrs.asdict(self)):
            raise problem

    def initial(self, num_replicas: int) -> int:
        """The count a backend starts with: `num_replicas` within the bounds."""
        return min(max(num_replicas, self.min_replicas), self.max_replicas)

    def up_limit(self, start: int) -> int:
        """The most replicas one scale-up period may reach from `start` replicas."""
        by_percent = math.ceil(start * (1 + self.scale_up_percent / 100))
        return max(by_percent, start + self.scale_up_replicas)

    def down_limit(self, start: int) -> int:
        """The fewest replicas one scale-down period may reach from `start` replicas (rounded
        down, as HPA does: 50 % of 1 lets it reach 0)."""
        return math.floor(start * (1 - self.scale_down_percent / 100))

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> AutoscalingConfig:
        """Build from a mapping; the first of its faults (``problems_of``) is raised."""
        for problem in problems_of(data):
            raise problem
        return cls(**data)  # type: ignore[arg-type]  # keys checked against the fields


def _across(values: Mapping[str, Any]) -> list[ConfigError]:
    """The rules that tie fields, over `values` (the fields that are fine alone)."""
    found = []
    low, high = values.get("min_replicas", 1), values.get("max_replicas")
    if high is not None and low > high:
        found.append(
            ConfigError(f"{_PREFIX}.min_replicas", f"must be <= max_replicas ({high})", low)
        )
    if values.get("scale_up_percent", 100.0) == 0 and values.get("scale_up_replicas", 4) == 0:
        found.append(
            ConfigError(
                f"{_PREFIX}.scale_up_percent",
                "scale_up_percent and scale_up_replicas may not both be 0: it could never scale up",
                0,
            )
        )
    return found


def problems_of(data: Mapping[str, object]) -> list[ConfigError]:
    """Every fault of a block given as a mapping: each field checked alone (as a manifest's
    fields are), and the rules that tie them over the fields that are fine alone."""
    fields = attrs.fields_dict(AutoscalingConfig)
    found: list[ConfigError] = []
    fine: dict[str, Any] = {}
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            found.append(
                ConfigError(
                    f"{_PREFIX}.{key}",
                    unknown_field(key, fields),
                    show_value=False,
                )
            )
            continue
        try:
            convert: Any = field.converter  # every field here has one: a function of the value
            fine[key] = convert(value)
        except ConfigError as exc:
            found.append(exc)
    if "max_replicas" not in data:
        found.append(ConfigError(f"{_PREFIX}.max_replicas", "is required", show_value=False))
    return found + _across(fine)


def autoscaling(value: object) -> AutoscalingConfig | None:
    """BackendConfig.autoscaling's converter: None, a config, or a mapping of its fields."""
    if value is None or isinstance(value, AutoscalingConfig):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(_PREFIX, "must be a table of autoscaling fields, or none", value)
    return AutoscalingConfig.from_dict(value)


def autoscaling_schema() -> dict[str, Any]:
    """The block as JSON Schema, for the API's document."""
    fields = attrs.fields(AutoscalingConfig)
    return {
        "type": ["object", "null"],
        "properties": {f.name: f.metadata["schema"] for f in fields},
        "required": ["max_replicas"],
        "additionalProperties": False,
        # Either policy lets it scale up (a field left out takes its default, which does).
        "anyOf": [
            {"type": "null"},
            {"properties": {"scale_up_percent": {"exclusiveMinimum": 0}}},
            {"properties": {"scale_up_replicas": {"exclusiveMinimum": 0}}},
        ],
        "description": "Autoscaling on ongoing requests, HPA's way; beyond what JSON Schema "
        "can say, min_replicas must be <= max_replicas (422 otherwise)",
    }
