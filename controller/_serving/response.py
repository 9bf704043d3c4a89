"""What a handler may return, and how each becomes an answer: ``str`` (text), ``bytes``
(octet-stream), a ``dict`` or ``list`` (JSON), ``None`` (an empty 200), a `Response` (status,
headers, content), or a generator, sync or async, whose items are sent as they are yielded
(chunked: tokens of a language model, server-sent events)."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any, Final, final

#: A header name (RFC 9110 token) and value (no CR, LF or NUL: nothing that would end the head).
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TOKENS_SEEN: set[bytes] = set()
#: Framing is the server's: a handler's own are dropped.
_FRAMING: Final = frozenset({b"content-length", b"transfer-encoding", b"connection"})

TEXT: Final = b"text/plain; charset=utf-8"
OCTETS: Final = b"application/octet-stream"
JSON_TYPE: Final = b"application/json"


class BadResult(TypeError):
    """A handler returned (or yielded) what no answer can be made of."""


@final
class Response:
    """An answer with a status and headers of your choosing, as Starlette's: ``Response(content,
    status_code=200, headers=None, media_type=None)``. `content` is ``str``, ``bytes``, a
    ``dict`` or ``list`` (sent as JSON), None (empty), or a generator or async generator
    (streamed: each item ``str``, ``bytes``, or a ``dict`` or ``list`` sent as a line of
    JSON). `headers` is a mapping, or (name, value) pairs for a name sent more than once
    (``Set-Cookie``). `media_type` is the Content-Type (by default from the content, as
    above). A 204 or 304 is sent without a body, whatever the content."""

    __slots__ = ("content", "headers", "media_type", "status_code")

    def __init__(
        self,
        content: Any = None,
        status_code: int = 200,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        media_type: str | None = None,
    ):
        if isinstance(status_code, bool) or not isinstance(status_code, int):
            raise TypeError(f"Response.status_code must be an int from 200 to 599: {status_code!r}")
        if not 200 <= status_code <= 599:
            raise ValueError(f"Response.status_code must be from 200 to 599: {status_code}")
        self.content = content
        self.status_code = status_code
        pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
        self.headers: list[tuple[str, str]] = [(str(k), str(v)) for k, v in pairs]
        self.media_type = media_type

    def __repr__(self) -> str:
        return f"<Response {self.status_code}>"


@final
class Answer:
    """An answer to send: status, headers (as bytes, checked) and either a whole body or items
    to stream."""

    __slots__ = ("body", "headers", "status", "stream")

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes = b"",
        stream: Iterator[Any] | AsyncIterator[Any] | None = None,
    ):
        self.status = status
        self.headers = headers
        self.body = body
        self.stream = stream


def answer_of(result: Any) -> Answer:
    """The answer `result` (a handler's return value) makes; ``BadResult`` if none."""
    if isinstance(result, Response):
        answer = _content(result.content)
        headers = _headers(result.headers)
        if result.media_type is not None:
            media = result.media_type.encode("latin-1", "replace")
            check_header(b"content-type", media)
            answer.headers = [(b"content-type", media)]
        names = {name for name, _ in headers}
        answer.headers = [h for h in answer.headers if h[0] not in names] + headers
        answer.status = result.status_code
        return answer
    return _content(result)


def _content(content: Any) -> Answer:
    if isinstance(content, str):
        return Answer(200, [(b"content-type", TEXT)], content.encode())
    if isinstance(content, (bytes, bytearray, memoryview)):
        return Answer(200, [(b"content-type", OCTETS)], bytes(content))
    if content is None:
        return Answer(200, [])
    if isinstance(content, (dict, list, int, float)) and not isinstance(content, bool):
        return Answer(200, [(b"content-type", JSON_TYPE)], _json(content))
    if isinstance(content, bool):
        return Answer(200, [(b"content-type", JSON_TYPE)], b"true" if content else b"false")
    if inspect.isgenerator(content) or inspect.isasyncgen(content):
        return Answer(200, [(b"content-type", TEXT)], stream=content)
    raise BadResult(
        f"a handler returned {type(content).__name__}: return str, bytes, a dict or list "
        "(JSON), None, a controller.Response, or a generator (streamed)"
    )


def item_bytes(item: Any) -> bytes:
    """One streamed item as the bytes sent: ``str`` (UTF-8), ``bytes``, or a dict or list as
    a line of JSON."""
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, (dict, list)):
        return _json(item) + b"\n"
    raise BadResult(
        f"a streamed handler yielded {type(item).__name__}: yield str, bytes, or a dict or "
        "list (a line of JSON)"
    )


def _json(value: Any) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise BadResult(f"a handler's result is not JSON: {exc}") from None


def _headers(given: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    for name, value in given:
        raw = str(name).encode("latin-1", "replace").lower()
        encoded = str(value).encode("latin-1", "replace")
        check_header(raw, encoded)
        if raw not in _FRAMING:
            out.append((raw, encoded))
    return out


def check_header(name: bytes, value: bytes) -> None:
    """``BadResult`` unless `name` is an HTTP token and `value` holds no CR, LF or NUL: a
    handler's header must not end the head, or begin another answer, early."""
    if name not in _TOKENS_SEEN:
        if not _TOKEN.fullmatch(name):
            raise BadResult(f"a response header name {name!r} is not an HTTP token")
        if len(_TOKENS_SEEN) < 1024:  # an application's few names, checked once each
            _TOKENS_SEEN.add(name)
    if b"\r" in value or b"\n" in value or b"\x00" in value:
        raise BadResult(f"the response header {name.decode('latin-1')!r} holds CR, LF or NUL")
