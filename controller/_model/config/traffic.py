"""The fields of a backend's config that its ingress reads: where the backend is routed, how many
requests one replica is sent at once, how many the backend may queue, and how long a request
may take."""

from __future__ import annotations

import re

from ..values.errors import ConfigError
from ..values.numbers import seconds, whole

#: A route: "/" or up to 16 segments of URL-safe characters, none empty, "." or "..", and none
#: starting with "-" (the ingress keeps "/-/" for itself: ``/-/healthz``, ``/-/routes``).
#: ASCII and spelled out, as the config's other patterns, for the API's JSON Schema.
ROUTE_PATTERN = r"/|(?:/[A-Za-z0-9_~][A-Za-z0-9._~-]{0,62}){1,16}"
_ROUTE = re.compile(ROUTE_PATTERN)

#: The most requests one replica may be sent at once, or one backend may queue at an ingress.
MAX_REQUESTS = 1_000_000
#: Uploads (request bodies too large to read before a replica is chosen) an ingress process
#: sends one backend at once by default: counted apart from ``max_ongoing_requests``, so a
#: replica's load may exceed that by as many (``IngressConfig.max_uploads``).
DEFAULT_MAX_UPLOADS = 64


def route_prefix(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _ROUTE.fullmatch(value):
        raise ConfigError(
            "BackendConfig.route_prefix",
            'must be None or a path like "/echo": "/" or segments of letters, digits and '
            "'_.~-' (at most 16), none empty or starting with '.' or '-'",
            value,
        )
    return value


def _request_count(field: str, lowest: int, value: object) -> int:
    count = whole(value)
    if count is None or not lowest <= count <= MAX_REQUESTS:
        raise ConfigError(
            f"BackendConfig.{field}",
            f"must be a whole number from {lowest} to {MAX_REQUESTS}",
            value,
        )
    return count


def max_ongoing(value: object) -> int:
    return _request_count("max_ongoing_requests", 1, value)


def max_queued(value: object) -> int:
    return _request_count("max_queued_requests", 0, value)


def request_timeout(value: object) -> float:
    return seconds("BackendConfig.request_timeout_s", value, allow_zero=False)
