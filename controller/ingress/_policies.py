"""What a backend's request policies ask of the ingress (beyond the choice of a replica, which
its routes make): whether a client (or a key, a header's value) may send one more request now,
else 429 with the seconds until it may; whether a request that never reached a replica is
tried on another, else 502."""

from __future__ import annotations

import math

import trio

from .._http.errors import Reply
from .._http.framing import RequestHead
from .._routing.policy import header_value
from .._routing.table import BackendRoutes


def admit(backend: BackendRoutes, head: RequestHead, peer: str) -> None:
    """Take a token of the request's bucket, or raise a 429 ``Reply`` (with ``retry_after``)."""
    limiter, policy = backend.limiter, backend.rate_limit
    if limiter is None or policy is None:
        return
    key = None
    if policy.header is not None:
        key = header_value(head.headers, policy.header.encode("ascii"))
    if not key:
        key = b"@" + peer.encode()  # the client's address (a header's value has no "@" first)
    wait = limiter.take(key, trio.current_time())
    if wait <= 0:
        return
    backend.counted("rate_limited")
    by = f"header {policy.header}" if policy.header is not None else "client address"
    raise Reply(
        429,
        "RateLimited",
        f"backend {backend.name!r} takes requests_per_s={policy.requests_per_s:g} "
        f"(burst={policy.capacity}) per {by}; try again in {wait:.3g} s",
        retry_after=max(1, math.ceil(wait)),
    )


def retry(backend: BackendRoutes, tried: frozenset[str], retrying: bool, exc: Exception) -> bool:
    """A request that never reached the replicas `tried` goes to another (True: it counts in
    the retry budget from now on), or a 502 ``Reply`` says why not."""
    why = backend.retry(len(tried), retrying)
    if why is not None:
        raise Reply(502, "BadGateway", f"{exc}; {why}") from None
    return True
