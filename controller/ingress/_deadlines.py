"""What a request's time is at the ingress: the seconds it may take (its backend's
``request_timeout_s``, or less if its client asks with ``x-request-timeout-ms``), and what a
client is told when a deadline passes before any answer went out."""

from __future__ import annotations

import trio

from .._http.connection import Connection
from .._http.framing import RequestHead
from .._routing.table import BackendRoutes
from ._config import IngressConfig

#: The time a request has left, in milliseconds: a client may send it to ask for less than its
#: backend's request_timeout_s, and the ingress sends the replica what is left.
TIMEOUT_HEADER = b"x-request-timeout-ms"
#: What a request that ran out of time in each phase is counted as.
EXPIRED_STATUS = {"head": 408, "body": 408, "request": 504, "upstream": 502, "deadline": 504}


def start_deadline(client: Connection, head: RequestHead, backend: BackendRoutes) -> float:
    """Set the request's own deadline, from now to the end of its answer (no phase's outlasts
    it), and return it."""
    client.request_deadline = deadline = trio.current_time() + budget(head, backend)
    client.timer.set(deadline, "deadline")
    return deadline


def expired_answer(phase: str, config: IngressConfig, upstream: str) -> tuple[int, str, str] | None:
    """What a client is told when the deadline of `phase` passes before any answer went out
    (status, kind, message); None: nothing (an idle connection just closes)."""
    where = f"the replica at {upstream}" if upstream else "the replica"
    if phase == "head":
        message = f"the request head did not arrive within {config.header_timeout_s:g} s"
        return 408, "RequestTimeout", message
    if phase == "body":
        message = f"the request body stalled for {config.body_timeout_s:g} s"
        if config.min_body_rate:
            message += (
                f" or came slower than min_body_rate={config.min_body_rate} bytes a second"
                f" over body_rate_window_s={config.body_rate_window_s:g}"
            )
        return 408, "RequestTimeout", message
    if phase == "request":
        message = f"{where} did not answer within request_timeout_s={config.request_timeout_s:g}"
        return 504, "GatewayTimeout", message
    if phase == "upstream":
        message = f"{where} stopped reading the request for {config.body_timeout_s:g} s"
        return 502, "BadGateway", message
    if phase == "deadline":
        message = (
            "the request did not complete within its backend's request_timeout_s (or the "
            f"{TIMEOUT_HEADER.decode()} it asked for)"
        )
        return 504, "GatewayTimeout", message
    return None


def budget(head: RequestHead, backend: BackendRoutes) -> float:
    """The seconds `head` may take: its backend's request_timeout_s, or less if it asks."""
    budget = backend.request_timeout_s
    for name, value in head.headers:
        if name == TIMEOUT_HEADER:
            try:
                asked = float(value) / 1000
            except ValueError:
                break
            # Less than nothing (or NaN) is nothing left, as a replica's server reads it.
            budget = min(budget, asked) if asked >= 0 else 0.0
            break
    return budget
