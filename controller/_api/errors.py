"""The HTTP status of each error the controller raises on purpose (for the API)."""

from __future__ import annotations

from .._model.values.errors import (
    ConfigError,
    ControllerClosedError,
    ControllerError,
    FencedError,
    InfeasibleError,
    NodesUnsupportedError,
    RolloutError,
    RouteConflictError,
    StoreError,
    UnknownApplicationError,
    UnknownBackendError,
    UnknownNodeError,
)
from .http import HTTPError

#: How soon a client may try again after the store failed (it is retried meanwhile).
STORE_RETRY_AFTER_S = 5


def domain_error(exc: ControllerError) -> HTTPError:
    """The status code of each error the controller raises on purpose."""
    if isinstance(exc, UnknownBackendError):
        return HTTPError(404, "UnknownBackend", str(exc))
    if isinstance(exc, UnknownApplicationError):
        return HTTPError(404, "UnknownApplication", str(exc))
    if isinstance(exc, UnknownNodeError):
        return HTTPError(404, "UnknownNode", str(exc))
    if isinstance(exc, NodesUnsupportedError):
        return HTTPError(501, "NodesUnsupported", str(exc))
    if isinstance(exc, ConfigError):
        # Checked by the controller against what the backend is (a scale's count).
        return HTTPError(422, "Invalid", str(exc), problems=[str(exc)])
    if isinstance(exc, InfeasibleError):
        return HTTPError(409, "Infeasible", f"{exc} Nothing was applied.")
    if isinstance(exc, RouteConflictError):
        return HTTPError(409, "RouteConflict", str(exc))
    if isinstance(exc, RolloutError):
        # No such revision is a missing thing (404); the rest (paused, deleting, no good
        # revision, the code changed) are refusals of what the backend is now (409).
        status = 404 if exc.reason == "UnknownRevision" else 409
        return HTTPError(status, exc.reason, str(exc))
    if isinstance(exc, FencedError):
        # A leader that slept through its lease: another leads now, and this one stands by
        # within a moment. The client tries again (here, it is then sent to the leader).
        return HTTPError(503, "NoLeader", f"{exc}; nothing was changed, try again", retry_after=1)
    if isinstance(exc, ControllerClosedError):
        return HTTPError(503, "ShuttingDown", str(exc))
    if isinstance(exc, StoreError):
        return HTTPError(
            503,
            "StoreUnavailable",
            f"{exc}; nothing was changed. Try again once the store can be written.",
            retry_after=STORE_RETRY_AFTER_S,
        )
    return HTTPError(500, type(exc).__name__, str(exc))
