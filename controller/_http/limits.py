"""How a server of ours treats the connections it accepts: its timeouts and limits (validated).
The ingress's config (``IngressConfig``) is these and what routing adds; a replica's server
takes them as they are."""

from __future__ import annotations

import attrs

from .._model.values.errors import ConfigError


def positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1e9:
        raise ConfigError(
            f"{type(instance).__name__}.{attribute.name}", "must be a number > 0 and <= 1e9", value
        )


def count(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
        raise ConfigError(
            f"{type(instance).__name__}.{attribute.name}",
            "must be a whole number from 0 to 1000000",
            value,
        )


def at_least_one(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    count(instance, attribute, value)
    if value < 1:
        raise ConfigError(
            f"{type(instance).__name__}.{attribute.name}", "must be at least 1", value
        )


@attrs.frozen(kw_only=True)
class ConnectionLimits:
    """The timeouts and limits of a server's client connections. The defaults suit HTTP
    services behind a proxy."""

    header_timeout_s: float = attrs.field(default=10.0, validator=positive)
    """How long a client may take to send a request's head once it has begun (408), and a new
    connection its first byte (closed)."""
    body_timeout_s: float = attrs.field(default=30.0, validator=positive)
    """How long a client may leave the request body, or the response it is sent, without
    progress: 408, or the connection is closed."""
    min_body_rate: int = attrs.field(default=1024, validator=count)
    """Bytes a second a request body must arrive at over each `body_rate_window_s` (0: no
    floor): each window of the client's time must bring ``min_body_rate * body_rate_window_s``
    bytes, or 408. A window ends when it has them (what came beyond is no credit for the next),
    so a body cannot bank a fast start and then trickle. Time the server spends waiting on its
    answer (a replica's, or the handler's) does not count against the client."""
    body_rate_window_s: float = attrs.field(default=10.0, validator=positive)
    """The window `min_body_rate` is judged over."""
    keepalive_timeout_s: float = attrs.field(default=60.0, validator=positive)
    """How long an idle client connection is kept open for its next request."""
    max_header_bytes: int = attrs.field(default=65536, validator=count)
    """The largest request head (request line and headers): 431 beyond."""
    max_target_bytes: int = attrs.field(default=8192, validator=at_least_one)
    """The longest request target (path and query): 414 beyond."""
    max_connections: int = attrs.field(default=10_000, validator=at_least_one)
    """Client connections served at once. At the limit, the one idle the longest is closed to
    make room for a new one; if none is idle, the new one is closed unserved."""
    max_connections_per_client: int = attrs.field(default=256, validator=at_least_one)
    """Client connections one address may hold open; more are closed unserved."""
