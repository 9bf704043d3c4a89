"""How an ingress treats clients and replicas: its timeouts and limits (validated)."""

from __future__ import annotations

import attrs

from .._model.errors import ConfigError


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1e9:
        raise ConfigError(
            f"IngressConfig.{attribute.name}", "must be a number > 0 and <= 1e9", value
        )


def _count(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
        raise ConfigError(
            f"IngressConfig.{attribute.name}", "must be a whole number from 0 to 1000000", value
        )


def _at_least_one(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    _count(instance, attribute, value)
    if value < 1:
        raise ConfigError(f"IngressConfig.{attribute.name}", "must be at least 1", value)


@attrs.frozen(kw_only=True)
class IngressConfig:
    """An ingress's timeouts and limits. The defaults suit HTTP services behind a proxy."""

    request_timeout_s: float = attrs.field(default=60.0, validator=_positive)
    """How long a replica may take to start its answer once the request is sent, and to send
    each next part of it: past it the client gets 504 (or, mid-answer, a cut response)."""
    queue_timeout_s: float = attrs.field(default=10.0, validator=_positive)
    """How long a request may wait in its backend's queue for a replica with room: 503."""
    header_timeout_s: float = attrs.field(default=10.0, validator=_positive)
    """How long a client may take to send a request's head once it has begun (408), and a new
    connection its first byte (closed)."""
    body_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    """How long a client may leave the request body, or the response it is sent, without
    progress: 408, or the connection is closed."""
    min_body_rate: int = attrs.field(default=1024, validator=_count)
    """Bytes a second a request body must arrive at, on average, once `header_timeout_s` has
    passed since its head (0: no floor): 408 below. Time the ingress spends waiting on the
    replica does not count against the client."""
    keepalive_timeout_s: float = attrs.field(default=60.0, validator=_positive)
    """How long an idle client connection is kept open for its next request."""
    connect_timeout_s: float = attrs.field(default=5.0, validator=_positive)
    """How long connecting to a replica may take before another is tried."""
    max_header_bytes: int = attrs.field(default=65536, validator=_count)
    """The largest request head (request line and headers): 431 beyond."""
    max_target_bytes: int = attrs.field(default=8192, validator=_at_least_one)
    """The longest request target (path and query): 414 beyond."""
    max_connections: int = attrs.field(default=10_000, validator=_at_least_one)
    """Client connections served at once. At the limit, the one idle the longest is closed to
    make room for a new one; if none is idle, the new one is closed unserved."""
    max_connections_per_client: int = attrs.field(default=256, validator=_at_least_one)
    """Client connections one address may hold open; more are closed unserved."""
    max_retries: int = attrs.field(default=3, validator=_count)
    """How many other replicas a request whose connection failed before it was sent is tried
    on (each replica once)."""
    prefer_host: str | None = None
    """Locality: send each request to a replica at this host (the ingress's own node) while one
    of them has room, by power of two choices among them; only when all of them are at
    ``max_ongoing_requests`` does the choice widen to every replica. None: every replica
    alike."""
    access_log: bool = False
    """Log one line per request (logger ``controller.ingress.access``)."""
