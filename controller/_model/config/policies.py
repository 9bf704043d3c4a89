"""A backend's request policies: how its routers retry, keep a client on one replica, and limit
a client's rate. Each is a block of its config, read by every router of the backend (the
ingress's and each process's handles) from the watch.

Like ``autoscaling``, none is part of a revision: changing one restarts nothing.

- ``retries``: a request that never reached a replica (its connection was refused or reset
  before any of it went out), or one that may be sent twice (GET, HEAD, OPTIONS without a body)
  whose replica closed the connection unanswered, is tried on another replica, at most
  ``max_retries`` times, and only while the router's retries in flight for the backend stay
  under Envoy's budget: ``max(min_retry_concurrency, budget_percent % of its active
  requests)``. A failing backend so sees at most a fifth more requests, never a multiple.
- ``affinity``: requests with the same value of a header or cookie go to the same replica while
  it lives and has room (consistent hashing with bounded load: no replica takes more than
  ``load_factor`` times the backend's mean load, so a hot key spills to the next replica on
  the ring, and when a replica comes or goes only the keys it takes or held move).
- ``rate_limit``: at the ingress, a token bucket per client address (or per value of a header,
  e.g. an API key): ``requests_per_s`` on average, bursts of ``burst``; beyond, 429 with
  ``Retry-After``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from ..values.errors import ConfigError
from ..values.fields import from_mapping, unknown_field
from ..values.numbers import MAX_COUNT, whole
from .canary import RESERVED_HEADERS, TOKEN_PATTERN

_TOKEN = re.compile(TOKEN_PATTERN)
_P = TypeVar("_P")
MAX_RETRIES = 10
MAX_RATE = 1e9
MAX_LOAD_FACTOR = 100.0
#: Headers the ingress and handles set on their own (a client's are dropped): no one's key.
_OURS = frozenset(
    {"x-request-timeout-ms", "x-max-ongoing-requests", "x-forwarded-prefix", "x-forwarded-proto"}
)
_TOKEN_SCHEMA = {"type": ["string", "null"], "pattern": f"^{TOKEN_PATTERN}$"}


def _count(field: str, low: int, high: int) -> Any:
    def check(value: object) -> int:
        number = whole(value)
        if number is None or not low <= number <= high:
            raise ConfigError(field, f"must be a whole number from {low} to {high}", value)
        return number

    return check


def _number(field: str, low: float, high: float, *, above: bool = False) -> Any:
    def check(value: object) -> float:
        fine = not isinstance(value, bool) and isinstance(value, (int, float))
        if fine:
            fine = (low < value if above else low <= value) and value <= high  # type: ignore[operator]
        if not fine:
            rule = f"above {low:g} and at most {high:g}" if above else f"from {low:g} to {high:g}"
            raise ConfigError(field, f"must be a number {rule}", value)
        return float(value)  # type: ignore[arg-type]

    return check


def _name(field: str, *, header: bool) -> Any:
    def check(value: object) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not _TOKEN.fullmatch(value):
            raise ConfigError(
                field,
                "must be None or a header or cookie name: 1-64 letters, digits or !#$%&'*+.^_`|~-",
                value,
            )
        if header and value.lower() in RESERVED_HEADERS:
            raise ConfigError(
                field,
                "must not be a header that frames or carries the request "
                f"({', '.join(sorted(RESERVED_HEADERS))}; for a cookie, the cookie field)",
                value,
            )
        if header and (value.lower() in _OURS or value.lower().startswith("x-controller-")):
            raise ConfigError(
                field,
                "must not be a header the controller sets itself (x-controller-*, "
                f"{', '.join(sorted(_OURS))})",
                value,
            )
        return value.lower() if header else value

    return check


def _field(converter: Any, schema: dict[str, Any], default: Any) -> Any:
    return attrs.field(default=default, converter=converter, metadata={"schema": schema})


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Which failed requests a router tries again on another replica, and how many at once."""

    max_retries: int = _field(
        _count("BackendConfig.retries.max_retries", 0, MAX_RETRIES),
        {"type": "integer", "minimum": 0, "maximum": MAX_RETRIES},
        3,
    )
    """How many other replicas one request may be tried on (each replica once). 0: none."""

    budget_percent: float = _field(
        _number("BackendConfig.retries.budget_percent", 0, 100),
        {"type": "number", "minimum": 0, "maximum": 100},
        20.0,
    )
    """Retries in flight may be at most this percent of the router's requests in flight (and
    queued) for the backend..."""

    min_retry_concurrency: int = _field(
        _count("BackendConfig.retries.min_retry_concurrency", 0, MAX_COUNT),
        {"type": "integer", "minimum": 0, "maximum": MAX_COUNT},
        3,
    )
    """...or this many, whichever is more (so that a quiet backend may still retry)."""

    def allows(self, retrying: int, active: int) -> bool:
        """Whether one more retry may start while `retrying` are in flight among `active`
        requests (Envoy's retry budget)."""
        return retrying < max(self.min_retry_concurrency, self.budget_percent * active / 100)


@attrs.frozen(kw_only=True)
class AffinityPolicy:
    """Keeps the requests of one key (a header's or a cookie's value) on one replica."""

    header: str | None = _field(
        _name("BackendConfig.affinity.header", header=True), _TOKEN_SCHEMA, None
    )
    """A request header whose value is the key (e.g. ``X-Session``)."""

    cookie: str | None = _field(
        _name("BackendConfig.affinity.cookie", header=False), _TOKEN_SCHEMA, None
    )
    """A cookie whose value is the key (the header's, if both are given and sent, wins). A
    request with neither goes where the load is least, as without the block."""

    load_factor: float = _field(
        _number("BackendConfig.affinity.load_factor", 1, MAX_LOAD_FACTOR),
        {"type": "number", "minimum": 1, "maximum": MAX_LOAD_FACTOR},
        1.25,
    )
    """No replica takes a keyed request while it holds more than this times the backend's
    mean requests in flight (rounded up): its key goes to the next replica on the ring. 1.25
    keeps a hot key from overloading one replica at the cost of moving some of its requests."""

    def __attrs_post_init__(self) -> None:
        if self.header is None and self.cookie is None:
            raise ConfigError(
                "BackendConfig.affinity.header", "a header or a cookie must be given", None
            )


@attrs.frozen(kw_only=True)
class RateLimitPolicy:
    """A token bucket per client (or per key) at each ingress process."""

    requests_per_s: float = _field(
        _number("BackendConfig.rate_limit.requests_per_s", 0, MAX_RATE, above=True),
        {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_RATE},
        attrs.NOTHING,
    )
    """The average rate one client (or key) may send."""

    burst: int | None = _field(
        lambda v: None if v is None else _count("BackendConfig.rate_limit.burst", 1, MAX_COUNT)(v),
        {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_COUNT},
        None,
    )
    """How many requests it may send at once after a quiet spell. None: a second's worth
    (`requests_per_s` rounded up)."""

    header: str | None = _field(
        _name("BackendConfig.rate_limit.header", header=True), _TOKEN_SCHEMA, None
    )
    """A request header whose value is the key (e.g. ``X-Api-Key``); a request without it
    counts against its client's address. None: the client's address (the peer of the
    ingress's connection: behind a proxy, use a header the proxy sets)."""

    @property
    def capacity(self) -> int:
        return self.burst if self.burst is not None else max(1, math.ceil(self.requests_per_s))


def _block(cls: type[_P], name: str, value: object) -> _P:
    """Policy block `name` of a config: a `cls` as it is, or one from a mapping of its fields."""
    return value if isinstance(value, cls) else from_mapping(cls, value, f"BackendConfig.{name}")


def retries(value: object) -> RetryPolicy:
    """BackendConfig.retries' converter: a policy, a mapping of its fields, or None (the
    defaults)."""
    return RetryPolicy() if value is None else _block(RetryPolicy, "retries", value)


def affinity(value: object) -> AffinityPolicy | None:
    """BackendConfig.affinity's converter: None, a policy, or a mapping of its fields."""
    return None if value is None else _block(AffinityPolicy, "affinity", value)


def rate_limit(value: object) -> RateLimitPolicy | None:
    """BackendConfig.rate_limit's converter: None, a policy, or a mapping of its fields."""
    return None if value is None else _block(RateLimitPolicy, "rate_limit", value)


#: The policy blocks of a backend's config, by field name.
POLICY_BLOCKS: dict[str, type[Any]] = {
    "retries": RetryPolicy,
    "affinity": AffinityPolicy,
    "rate_limit": RateLimitPolicy,
}


def policy_problems(block: str, data: Mapping[str, object]) -> list[ConfigError]:
    """Every fault of policy `block` (``retries``, ``affinity``, ``rate_limit``) given as a
    mapping, each field checked alone (as a manifest's are), then the block whole if they all
    pass (its rules that tie fields, and those it requires)."""
    cls = POLICY_BLOCKS[block]
    field = f"BackendConfig.{block}"
    known = attrs.fields_dict(cls)
    found: list[ConfigError] = []
    for key, value in data.items():
        spec = known.get(key)
        if spec is None:
            found.append(
                ConfigError(
                    f"{field}.{key}",
                    unknown_field(key, known),
                    show_value=False,
                )
            )
            continue
        try:
            spec.converter(value)  # type: ignore[operator, misc]  # a plain function, for each
        except ConfigError as exc:
            found.append(exc)
    if not found:
        try:
            _block(cls, block, data)
        except ConfigError as exc:
            found.append(exc)
    return found


def _properties(cls: type[Any]) -> dict[str, Any]:
    return {f.name: f.metadata["schema"] for f in attrs.fields(cls)}


def retries_schema() -> dict[str, Any]:
    return {
        "type": ["object", "null"],
        "properties": _properties(RetryPolicy),
        "additionalProperties": False,
        "description": "Retries of requests that never reached a replica (or may be sent "
        "twice), within Envoy's budget; null: the defaults",
    }


def affinity_schema() -> dict[str, Any]:
    return {
        "type": ["object", "null"],
        "properties": _properties(AffinityPolicy),
        "additionalProperties": False,
        "anyOf": [
            {"type": "null"},
            {"required": ["header"], "properties": {"header": {"type": "string"}}},
            {"required": ["cookie"], "properties": {"cookie": {"type": "string"}}},
        ],
        "description": "Session affinity by a header or cookie, consistent hashing with "
        "bounded load; beyond what JSON Schema can say, a header must not be one that frames "
        "or carries the request (422 otherwise)",
    }


def rate_limit_schema() -> dict[str, Any]:
    return {
        "type": ["object", "null"],
        "properties": _properties(RateLimitPolicy),
        "required": ["requests_per_s"],
        "additionalProperties": False,
        "description": "A per-client (or per-key) rate limit at each ingress process; beyond "
        "what JSON Schema can say, a header must not be one that frames or carries the request",
    }
