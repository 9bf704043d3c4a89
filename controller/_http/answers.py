"""HTTP/1.1 answers: those a server sends, read through llhttp (``httptools``: how the ingress
reads a replica's), and the heads our servers write (a replica's answer re-framed by the
ingress, a replica's own, or an error of ours). No I/O and no trio."""

from __future__ import annotations

import collections
import http
import json
from typing import Any, final

import httptools

from .framing import END, HOP_BY_HOP, End, Problem, header_tokens


class _HeadOnly(Exception):
    """Stops the response parser at the head of an answer to HEAD (llhttp would wait for the
    body its Content-Length names)."""


@final
class ResponseHead:
    __slots__ = ("headers", "keep_alive", "length", "reason", "status")

    def __init__(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]]):
        self.status = status
        self.reason = reason
        self.headers = headers
        self.length: int | None = None
        """Its Content-Length; None: chunked, or until the replica closes."""
        self.keep_alive = True


@final
class ResponseReader:
    """Reads one replica's answers: `feed` appends a `ResponseHead` (1xx answers skipped), body
    chunks and `END` to `events`; `closed` says what the replica closing the connection means.
    Raises `Problem` (502) for an answer that cannot be read."""

    def __init__(self) -> None:
        self.events: collections.deque[ResponseHead | bytes | End] = collections.deque()
        self.head_only = False
        """The request was HEAD: its answer ends with its head."""
        self.extra = False
        """Bytes came past the end of the answer: the connection cannot carry another."""
        self.ended = False
        self.began = False
        """Some of an answer has arrived."""
        self._parser = httptools.HttpResponseParser(self)
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head: ResponseHead | None = None
        self._until_close = False
        self._size = 0

    def feed(self, data: bytes) -> None:
        if self.ended:
            self.extra = True
            return
        self.began = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadOnly):
                self.ended, self.extra = True, True  # where its head ended is not known
                self.events.append(END)
                return
            self._malformed(str(exc))
        except httptools.HttpParserUpgrade:
            raise Problem(502, "BadGateway", "the replica switched protocols") from None
        except httptools.HttpParserError as exc:
            self._malformed(str(exc))

    def _malformed(self, why: str) -> None:
        if self.ended:
            # The answer was whole; what came after it (a replica that read the request's
            # body as a request of its own, and answered that) is no part of it.
            self.extra = True
            return
        raise Problem(502, "BadGateway", f"the replica's answer is malformed: {why}")

    def closed(self) -> bool:
        """The replica closed the connection: whether that ends its answer (one framed by the
        close) rather than cutting it short."""
        if self._head is not None and self._until_close and not self.ended:
            self.ended = True
            self.events.append(END)
            return True
        return False

    def on_message_begin(self) -> None:
        if self.ended:
            self.extra = True
        self._reason, self._headers, self._size = b"", [], 0

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._size += len(name) + len(value) + 4
        if self._size > 1 << 20:
            raise Problem(502, "BadGateway", "the replica's answer head is over 1 MiB")
        if self._head is None:
            self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            return  # 1xx: not passed on; the answer follows
        head = ResponseHead(status, self._reason, self._headers)
        http_10 = self._parser.get_http_version() == "1.0"
        chunked = False
        for name, value in head.headers:
            if name == b"content-length":
                head.length = int(value)
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"connection":
                tokens = header_tokens(value)
                if b"close" in tokens or (http_10 and b"keep-alive" not in tokens):
                    head.keep_alive = False
        if http_10 and not any(n == b"connection" for n, _ in head.headers):
            head.keep_alive = False
        if chunked:
            head.length = None
        no_body = status in (204, 304) or self.head_only
        if no_body:
            head.length = 0 if head.length is None else head.length
        self._until_close = head.length is None and not chunked and not no_body
        if self._until_close:
            head.keep_alive = False
        self._head = head
        self.events.append(head)
        if self.head_only:
            raise _HeadOnly

    def on_body(self, body: bytes) -> None:
        self.events.append(body)

    def on_message_complete(self) -> None:
        if self._head is None:
            return  # a 1xx answer's end
        self.ended = True
        self.events.append(END)


def response_head(
    head: ResponseHead, *, chunked: bool, close: bool, extra: tuple[bytes, ...] = ()
) -> bytes:
    """The head sent to the client: the replica's, less its hop's headers, framed by
    Content-Length as the replica framed it, else `chunked` (or, for an HTTP/1.0 client, by
    closing), with ``Connection: close`` when `close`."""
    out = [b"HTTP/1.1 %d %s\r\n" % (head.status, head.reason)]
    # A 204 has no body, and says no length (RFC 9110 8.6): one a replica gave is dropped.
    no_length = head.length is None or head.status == 204
    for key, value in head.headers:
        if key in HOP_BY_HOP:
            continue
        if key == b"content-length" and no_length:
            continue
        out += (key, b": ", value, b"\r\n")
    if chunked:
        out.append(b"transfer-encoding: chunked\r\n")
    if close:
        out.append(b"connection: close\r\n")
    out += extra
    out.append(b"\r\n")
    return b"".join(out)


def own_answer(
    status: int,
    content_type: bytes,
    body: bytes,
    *,
    close: bool,
    head_only: bool = False,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> bytes:
    """An answer of our own (not passed on from elsewhere), whole."""
    out = [
        b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n"
        % (status, reason(status), content_type, len(body))
    ]
    for key, value in extra:
        out += (key, b": ", value, b"\r\n")
    if close:
        out.append(b"connection: close\r\n")
    out.append(b"\r\n")
    if not head_only:
        out.append(body)
    return b"".join(out)


def served_head(
    status: int,
    headers: list[tuple[bytes, bytes]],
    *,
    length: int | None,
    close: bool,
    chunked: bool = False,
) -> bytes:
    """The head of an answer a server makes itself (a replica's handler), with `headers` as
    given (checked by the caller: tokens, no CR or LF), framed by `length`, else `chunked`,
    else by the connection's end (then `close` must be set)."""
    out = [b"HTTP/1.1 %d %s\r\n" % (status, reason(status))]
    for key, value in headers:
        out += (key, b": ", value, b"\r\n")
    if length is not None:
        out.append(b"content-length: %d\r\n" % length)
    elif chunked:
        out.append(b"transfer-encoding: chunked\r\n")
    if close:
        out.append(b"connection: close\r\n")
    out.append(b"\r\n")
    return b"".join(out)


def reason(status: int) -> bytes:
    """The reason phrase of `status` (empty for one HTTP does not name)."""
    known = REASONS.get(status)
    if known is None:
        try:
            known = http.HTTPStatus(status).phrase.encode()
        except ValueError:
            known = b""
        if len(REASONS) < 200:
            REASONS[status] = known
    return known


REASONS: dict[int, bytes] = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    408: b"Request Timeout",
    414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
    501: b"Not Implemented",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
    505: b"HTTP Version Not Supported",
}


def error_body(kind: str, message: str, **extra: Any) -> bytes:
    """The JSON body of an error of ours."""
    return json.dumps({"error": {"type": kind, "message": message, **extra}}).encode()


#: The end of a chunked body.
LAST_CHUNK = b"0\r\n\r\n"


def pass_on(events: collections.deque[Any], out: bytearray, chunks: bool) -> bool:
    """Move the answer's events held so far into `out`, framed for the client; whether the
    answer ended among them."""
    while events:
        event = events.popleft()
        if event is END:
            if chunks:
                out += LAST_CHUNK
            return True
        if chunks:
            out += b"%x\r\n" % len(event)
            out += event
            out += b"\r\n"
        else:
            out += event
    return False
