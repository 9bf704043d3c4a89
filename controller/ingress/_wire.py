"""The head the ingress sends on to a replica, built as bytes from the client's request as
``_http.framing`` read it: less the client's hop, with where the request came from."""

from __future__ import annotations

import re
from typing import Final

from .._http.framing import HOP_BY_HOP, RequestHead
from .._routing.split import SIDE_HEADER, Side
from .._routing.table import BackendRoutes
from .._routing.upstream import UPLOAD_HEADER

#: Set by the ingress alone: a client's own are dropped (its time left it reads first).
OURS: Final = frozenset(
    {
        b"x-forwarded-proto",
        b"x-forwarded-prefix",
        b"x-request-timeout-ms",
        b"x-max-ongoing-requests",
        b"x-controller-call",  # a method call is a handle's, never a client's
        SIDE_HEADER,  # the split's choice, not the client's (a force_header says that)
        UPLOAD_HEADER,
    }
)
#: What a request's head loses on its way to a replica (more if its Connection names more).
DROPPED: Final = HOP_BY_HOP | OURS
_REWRITTEN: Final = frozenset({b"host", b"x-forwarded-for", b"cookie"})


def upstream_head(
    head: RequestHead,
    peer: str,
    backend: BackendRoutes,
    fallback_host: str,
    left_ms: int,
    side: Side | None = None,
    length: int | None = None,
    upload: bool = False,
) -> bytes:
    """The head sent to the replica: the client's, less what belongs to the client's hop (and
    the headers its Connection header names), in origin form, with a Host, with where it came
    from, with the milliseconds it has left, and with its backend's max_ongoing_requests as it
    is now (code the worker serves holds to both), and the `side` of a canary's split it went
    to. A chunked body read whole goes by its `length`; an `upload` says it is one. Every value
    sent was accepted by the reader, so it is valid on the wire."""
    # Most requests name nothing in Connection: their set is the framing's own, ours is known.
    dropped = DROPPED if head.dropped is HOP_BY_HOP else head.dropped | OURS
    out = [head.method, b" ", head.target, b" HTTP/1.1\r\n"]
    host = b""
    forwarded: list[bytes] = []
    for key, value in head.headers:
        if key in dropped:
            continue
        if key in _REWRITTEN:
            if key == b"host":
                host = value
                continue
            if key == b"x-forwarded-for":
                forwarded.append(value)
                continue
            value = _without_console_session(value)  # the cookie
            if not value:
                continue
        out += (key, b": ", value, b"\r\n")
    if head.chunked:
        if length is None:
            out.append(b"transfer-encoding: chunked\r\n")
        else:
            out.append(b"content-length: %d\r\n" % length)
    if upload:
        out += (UPLOAD_HEADER, b": 1\r\n")
    if side is not None:
        out += (SIDE_HEADER, b": ", side.encode(), b"\r\n")
    forwarded.append(peer.encode())
    out += (
        b"host: ",
        host or fallback_host.encode(),  # HTTP/1.0 clients may send none
        b"\r\nx-forwarded-for: ",
        b", ".join(forwarded),
        b"\r\nx-forwarded-proto: http\r\nx-forwarded-prefix: ",
        backend.route_prefix.encode(),
        b"\r\nx-request-timeout-ms: %d\r\nx-max-ongoing-requests: %d\r\n\r\n"
        % (left_ms, backend.max_ongoing),
    )
    return b"".join(out)


#: The daemon's console session cookies (``controller_session_PORT``): a browser sends them to
#: every port of the host, this one included, and they are nothing a replica should see.
_CONSOLE_COOKIE = re.compile(rb"\s*controller_session(?:_[0-9]+)?=")


def _without_console_session(cookies: bytes) -> bytes:
    if b"controller_session" not in cookies:
        return cookies
    kept = [c.strip() for c in cookies.split(b";") if not _CONSOLE_COOKIE.match(c)]
    return b"; ".join(c for c in kept if c)
