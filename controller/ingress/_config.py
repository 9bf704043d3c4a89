"""How an ingress treats clients and replicas: its timeouts and limits (validated)."""

from __future__ import annotations

import attrs

from .._http.limits import ConnectionLimits, at_least_one, count, positive
from .._model.config.traffic import DEFAULT_MAX_UPLOADS


@attrs.frozen(kw_only=True)
class IngressConfig(ConnectionLimits):
    """An ingress's timeouts and limits: those of its client connections (`ConnectionLimits`'
    fields), and how it treats replicas. The defaults suit HTTP services behind a proxy."""

    request_timeout_s: float = attrs.field(default=60.0, validator=positive)
    """How long a replica may take to start its answer once the request is sent, and to send
    each next part of it: past it the client gets 504 (or, mid-answer, a cut response). A
    backend's own ``request_timeout_s`` bounds the whole request as well."""
    queue_timeout_s: float = attrs.field(default=10.0, validator=positive)
    """How long a request may wait in its backend's queue for a replica with room: 503."""
    connect_timeout_s: float = attrs.field(default=5.0, validator=positive)
    """How long connecting to a replica may take before another is tried."""
    buffer_body_bytes: int = attrs.field(default=65536, validator=count)
    """Request bodies up to this size (by ``Content-Length``, or chunked ones that end within
    it) are read whole before a replica is chosen: a client that sends one slowly holds no
    replica's room meanwhile. A process holds at most ``max_connections`` of them at once, so
    this bounds its memory too. Larger bodies are uploads (``max_uploads``)."""
    max_uploads: int = attrs.field(default=DEFAULT_MAX_UPLOADS, validator=at_least_one)
    """Bodies beyond ``buffer_body_bytes`` streamed to one backend's replicas at once, by this
    process: they are counted here until answered, not against ``max_ongoing_requests`` (a
    slow one cannot take the room of the requests that use it). More get 503 ``TooManyUploads``."""
    max_uploads_per_client: int = attrs.field(default=16, validator=at_least_one)
    """Of those, how many one address may have under way in this process: more get 429
    ``TooManyUploads``."""
    prefer_host: str | None = None
    """Locality: send each request to a replica at this host (the ingress's own node) while one
    of them has room, by power of two choices among them; only when all of them are at
    ``max_ongoing_requests`` does the choice widen to every replica. None: every replica
    alike."""
    access_log: bool = False
    """Log one line per request (logger ``controller.ingress.access``)."""
