"""HTTP/1.1 requests as clients send them, read through llhttp (``httptools``, strict: it
refuses what RFC 9112 refuses, a request with both ``Content-Length`` and ``Transfer-Encoding``
among them), with the rules every server of ours applies to them (the ingress's and a
replica's alike: one parser, one set of framing and smuggling rules). Answers are ``answers``'.
No I/O and no trio: fed bytes, it yields events.

The parsers never pause: everything fed is parsed at once, the events kept in order. A request
is a `RequestHead`, then its body as `bytes` chunks, then `END`; a `Problem` ends the
connection (what the client sent cannot be read further)."""

from __future__ import annotations

import collections
import re
from typing import Final, final

import httptools

#: Not passed on: they describe one hop, not the message (RFC 9110 7.6.1).
HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-authorization",
        b"expect",
    }
)
#: The headers that say how to read a request: never the client's hop's to drop by naming them
#: in ``Connection``.
FRAMING: Final = frozenset({b"host", b"content-length", b"transfer-encoding"})


class End:
    """The end of a request's body (or of a response's)."""

    def __repr__(self) -> str:
        return "END"


END: Final = End()


@final
class Problem(Exception):
    """What a client sent cannot be served: answer `status` (`kind`, `message`) and close."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind = status, kind


@final
class RequestHead:
    """A request's line and headers, as read (header names in lower case), and what the
    framing rules made of them."""

    __slots__ = (
        "body",
        "chunked",
        "complete",
        "dropped",
        "expect_continue",
        "headers",
        "http_10",
        "keep_alive",
        "length",
        "method",
        "path",
        "target",
    )

    def __init__(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]):
        self.method = method
        self.target = target
        self.headers = headers
        self.path = ""
        """The target's path, checked (`check_path`), as routed and as the replica gets it."""
        self.http_10 = False
        self.keep_alive = True
        """The client keeps the connection after this request (HTTP/1.1 without ``close``)."""
        self.body: bool = False
        """A body follows (``Content-Length`` above 0, or chunked)."""
        self.chunked = False
        """Its body is chunked (and is passed on chunked)."""
        self.length: int | None = 0
        """Its Content-Length (None: chunked)."""
        self.expect_continue = False
        self.complete = False
        """Set by the reader once the whole request (its body too) has arrived."""
        self.dropped = HOP_BY_HOP
        """The headers that belong to the client's hop: the hop-by-hop ones, and any its
        Connection header names (a proxy passes none of them on)."""


#: Request-target paths refused with 400: dot segments (``/a/../b``, encoded too, and with
#: parameters, ``/a/..;x/b``, which servlet containers read as ``..``) and encoded slashes and
#: backslashes. Another component (the replica, a framework) could read any of them as a
#: different path than the one routed on, so none is passed on.
_UNSAFE_PATH = re.compile(
    r"(?:^|/)(?:\.|%2e){1,2}(?:(?:;|%3b)[^/]*)?(?:/|$)|%2f|%5c|\\",
    re.IGNORECASE,
)
#: Requests a client may pipeline (send before the first is answered) in one go.
MAX_PIPELINED = 32
#: Header lines a request head may hold (Apache's LimitRequestFields default): a head of 10,000
#: short lines fits the byte limit, and every one would be forwarded.
MAX_HEADER_LINES = 100


def check_path(target: bytes) -> tuple[bytes, str, bytes]:
    """The origin-form target to send on, its path, and the authority an absolute-form target
    named (else ``b""``). Raises `Problem` (400) for a target that is neither form, or whose
    path `_UNSAFE_PATH` refuses."""
    authority = b""
    if target.startswith(b"/"):
        origin = target
    elif target[:7].lower() == b"http://" or target[:8].lower() == b"https://":
        rest = target.partition(b"//")[2]
        cut = len(rest)
        for mark in (b"/", b"?", b"#"):
            at = rest.find(mark)
            if 0 <= at < cut:
                cut = at
        authority, origin = rest[:cut], rest[cut:]
        if b"@" in authority:
            # RFC 9110 4.2.4: userinfo in an http(s) URI from an untrusted source is an error;
            # passed on, it would become the replica's Host header.
            raise Problem(400, "BadRequest", "the request target's authority holds userinfo ('@')")
        if not origin.startswith(b"/"):
            origin = b"/" + origin
    else:
        raise Problem(400, "BadRequest", "the request target must be a path (or an absolute URL)")
    if b"#" in origin:
        # A fragment is the client's business (RFC 9112 3.2): what follows it would reach the
        # replica unchecked.
        raise Problem(400, "BadRequest", "a request target holds no fragment ('#')")
    path = origin.partition(b"?")[0].decode("latin-1")
    # Most paths hold none of the three characters any refusal needs: no regex for those.
    if ("." in path or "%" in path or "\\" in path) and _UNSAFE_PATH.search(path):
        raise Problem(
            400,
            "BadPath",
            "the path holds a dot segment ('.' or '..') or an encoded slash or backslash; the "
            "server takes only paths every component reads alike",
        )
    return origin, path, authority


def header_tokens(value: bytes) -> list[bytes]:
    return [t.strip().lower() for t in value.split(b",") if t.strip()]


@final
class RequestReader:
    """Reads requests from a client's bytes: `feed` appends events to `events`. Limits: the
    request target `max_target` bytes (414), the head `max_head` bytes (431); a head that never
    ends is the caller's timeout."""

    def __init__(self, max_target: int, max_head: int):
        self.max_target = max_target
        self.max_head = max_head
        self.queued_heads = 0
        """Heads in `events` not taken yet (the caller counts down what it takes)."""
        self.events: collections.deque[RequestHead | bytes | End | Problem] = collections.deque()
        self.in_head = False
        """A head has begun and not ended: it must arrive within the head timeout."""
        self.in_body = False
        """A head has been read and its body has not ended."""
        self.failed = False
        """A `Problem` was queued: nothing more is read."""
        self._parser = httptools.HttpRequestParser(self)
        self._url: list[bytes] = []
        self._url_size = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._size = 0  # what the head holds so far: its target, names and values
        self._fed = 0  # bytes fed since the head began (whitespace included)
        self._current: RequestHead | None = None

    def feed(self, data: bytes) -> None:
        """Parse `data`; what it completes goes to `events`."""
        if self.failed:
            return
        if self.in_head:
            self._fed += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            problem = exc.__context__
            self._fail(
                problem
                if isinstance(problem, Problem)
                else Problem(400, "BadRequest", f"malformed request: {exc}")
            )
            return
        except httptools.HttpParserUpgrade:
            # A request that asks to switch protocols, served as a plain one (see
            # on_headers_complete): it is the connection's last; nothing after it is read.
            self.failed = True
            return
        except httptools.HttpParserError as exc:
            if str(exc) == "Invalid HTTP version":
                self._fail(
                    Problem(505, "HTTPVersionNotSupported", "only HTTP/1.0 and 1.1 are served")
                )
            else:
                self._fail(Problem(400, "BadRequest", f"malformed request: {exc}"))
            return
        if self.in_head and self._fed > 4 * self.max_head:
            # Leading whitespace is not in what the head holds; the bytes sent still count.
            self._fail(Problem(431, "HeadersTooLarge", self._too_large()))

    def _fail(self, problem: Problem) -> None:
        self.failed = True
        self.in_head = self.in_body = False
        self.events.append(problem)

    def _too_large(self) -> str:
        return f"the request head is over {self.max_head} bytes"

    # -- llhttp's callbacks --

    def on_message_begin(self) -> None:
        self.in_head = True
        self._url, self._url_size, self._headers = [], 0, []
        self._size = self._fed = 0

    def on_url(self, url: bytes) -> None:
        self._url_size += len(url)
        if self._url_size > self.max_target:
            raise Problem(414, "URITooLong", f"the request target is over {self.max_target} bytes")
        self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._size += len(name) + len(value) + 4
        if self._size + self._url_size > self.max_head:
            raise Problem(431, "HeadersTooLarge", self._too_large())
        if self.in_body:
            return  # a trailer of a chunked body: not passed on
        if len(self._headers) >= MAX_HEADER_LINES:
            raise Problem(
                431, "HeadersTooLarge", f"the request head holds over {MAX_HEADER_LINES} lines"
            )
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        target = b"".join(self._url)
        head = RequestHead(self._parser.get_method(), target, self._headers)
        version = self._parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise Problem(505, "HTTPVersionNotSupported", f"HTTP/{version} is not served")
        head.http_10 = version == "1.0"
        hosts = 0
        chunked = False
        length = b""
        for name, value in head.headers:
            if name == b"host":
                hosts += 1
            elif name == b"transfer-encoding":
                if header_tokens(value) != [b"chunked"] or chunked:
                    raise Problem(
                        501, "NotImplemented", "the only transfer coding served is chunked"
                    )
                chunked = True
            elif name == b"content-length":
                length = value
            elif name == b"connection":
                tokens = header_tokens(value)
                if b"close" in tokens or (head.http_10 and b"keep-alive" not in tokens):
                    head.keep_alive = False
                # The headers that say how to read the request are never the client's hop's
                # to drop by naming them.
                head.dropped = head.dropped | (frozenset(tokens) - FRAMING)
            elif name == b"expect" and not head.http_10:  # HTTP/1.0 ignores it (RFC 9110)
                if value.strip().lower() != b"100-continue":
                    # RFC 9110 10.1.1: an expectation the server cannot meet is refused, not
                    # dropped (the client would take the request as served as it asked).
                    raise Problem(
                        417, "ExpectationFailed", "the only expectation served is 100-continue"
                    )
                head.expect_continue = True
        if head.http_10 and (chunked or not any(n == b"connection" for n, _ in head.headers)):
            # An HTTP/1.0 message with Transfer-Encoding is treated as faultily framed: the
            # connection closes after it (RFC 9112 6.1).
            head.keep_alive = False
        if head.http_10:
            head.expect_continue = False  # 100 Continue is not for HTTP/1.0 (RFC 9110 15.2)
        if hosts > 1 or (hosts == 0 and not head.http_10):
            raise Problem(400, "BadRequest", "an HTTP/1.1 request needs exactly one Host header")
        head.chunked = chunked
        head.length = None if chunked else int(length or b"0")  # digits: llhttp checked
        head.body = bool(chunked or head.length)
        if self._parser.should_upgrade():
            # Upgrade (WebSocket, h2c) or CONNECT: llhttp stops after the head. One without a
            # body is served as a plain request (Upgrade is a hop's header, not passed on) and
            # the connection closed after it; one with a body is refused, since where its
            # body ends and the next request begins would be anyone's guess.
            if head.method == b"CONNECT" or head.body:
                raise Problem(
                    501, "NotImplemented", "CONNECT, and upgrades with a body, are not served"
                )
            head.keep_alive = False
        head.target, head.path, authority = check_path(target)
        if authority:
            # The absolute form's authority is the request's host (RFC 9112 3.2.2).
            head.headers = [(n, v) for n, v in head.headers if n != b"host"]
            head.headers.append((b"host", authority))
        if self.queued_heads >= MAX_PIPELINED:
            # Each costs memory until it is served; a client that sends thousands at once
            # (and reads none of their answers) is stopped here.
            raise Problem(
                400,
                "TooManyPipelined",
                f"more than {MAX_PIPELINED} requests arrived before the first was answered",
            )
        self.in_head, self.in_body = False, True
        self._current = head
        self.queued_heads += 1
        self.events.append(head)

    def on_body(self, body: bytes) -> None:
        self.events.append(body)

    def on_message_complete(self) -> None:
        self.in_head = self.in_body = False
        head = self._current
        self._current = None
        if head is not None:
            head.complete = True
            if head.body:
                self.events.append(END)  # a request without a body is its head alone
