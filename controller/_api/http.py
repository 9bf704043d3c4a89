"""The HTTP plumbing under the API: ASGI types, the error a handler raises, and reading a
request (its body, its query parameters) by the rules the OpenAPI document states."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, NoReturn, overload

import trio

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 1 << 20
#: A body refused as too large is still read, this far, and thrown away before the answer: a
#: client that sends its whole body before it reads (urllib, most scripts) then gets the 413,
#: not a connection reset (a socket closed with bytes unread resets the connection).
DISCARD_BYTES, DISCARD_S = 8 << 20, 2.0


class HTTPError(Exception):
    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        retry_after: int | None = None,
        allow: tuple[str, ...] = (),
        location: str | None = None,
        **extra: Any,
    ):
        self.status = status
        self.body = {"error": {"type": kind, "message": message, **extra}}
        self.retry_after = retry_after
        self.allow = allow
        self.location = location
        super().__init__(message)


def check_method(method: str, allowed: tuple[str, ...], path: str) -> None:
    """405, with Allow, for a method `path` does not take."""
    if method not in allowed:
        raise HTTPError(
            405,
            "MethodNotAllowed",
            f"{method} is not allowed on {path}; allowed: {', '.join(allowed)}",
            allow=allowed,
        )


_INTEGER = re.compile(r"-?[0-9]{1,30}")
#: The largest cursor, offset or count a query may carry (a signed 64-bit integer's).
MAX_QUERY_INT = 2**63 - 1
_NUMBER = re.compile(r"-?(?:[0-9]{1,30}(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")


@overload
def int_param(
    query: dict[str, list[str]], name: str, default: int, *, low: int = 0, high: int | None = None
) -> int: ...
@overload
def int_param(
    query: dict[str, list[str]], name: str, default: None, *, low: int = 0, high: int | None = None
) -> int | None: ...
def int_param(
    query: dict[str, list[str]],
    name: str,
    default: int | None,
    *,
    low: int = 0,
    high: int | None = None,
) -> int | None:
    """A whole number from `low` to `high` (2**63-1 if not given)."""
    # Written out as digits only: Python's int() would take " 5", "+5" and "5_0" too.
    value = query.get(name, [None])[-1]
    if value is None:
        return default
    top = MAX_QUERY_INT if high is None else high
    if not _INTEGER.fullmatch(value) or not low <= int(value) <= top:
        shown = "2**63-1" if high is None else f"{high}"
        raise HTTPError(
            400,
            "BadQuery",
            f"{name} must be a whole number from {low} to {shown}, not {value!r:.40}",
        )
    return int(value)


def number_param(query: dict[str, list[str]], name: str, default: float) -> float:
    value = query.get(name, [None])[-1]
    if value is None:
        return default
    if not _NUMBER.fullmatch(value):
        raise HTTPError(400, "BadQuery", f"{name} must be a number, not {value!r}")
    return float(value)


def flag(query: dict[str, list[str]], name: str, *, default: bool) -> bool:
    value = query.get(name, [None])[-1]
    if value is None:
        return default
    if value not in ("true", "false"):
        raise HTTPError(400, "BadQuery", f"{name} must be true or false, not {value!r}")
    return value == "true"


async def read_body(scope: Scope, receive: Receive) -> bytes:
    declared = dict(scope["headers"]).get(b"content-length", b"").strip()
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        # Said to be too large: refused without keeping any of it.
        await _too_large(receive)
    for key, value in scope["headers"]:
        if key == b"content-type":
            media_type = bytes(value).partition(b";")[0].strip().lower()
            if media_type == b"application/json":
                break
            raise HTTPError(
                415, "UnsupportedMediaType", "the body must be sent as application/json"
            )
    else:
        raise HTTPError(415, "UnsupportedMediaType", "the body must be sent as application/json")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HTTPError(400, "Disconnected", "the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            await _too_large(receive)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _too_large(receive: Receive) -> NoReturn:
    """Refuse a body over `MAX_BODY_BYTES`, once what follows of it (to `DISCARD_BYTES` or
    `DISCARD_S`) has been read and dropped."""
    left = DISCARD_BYTES
    with trio.move_on_after(DISCARD_S):
        while left > 0:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            left -= len(message.get("body", b""))
            if not message.get("more_body", False):
                break
    raise HTTPError(413, "TooLarge", f"the body is over {MAX_BODY_BYTES} bytes")


def _not_json(literal: str) -> Any:
    # Python's parser takes NaN and Infinity, which JSON does not have.
    raise ValueError(f"{literal} is not JSON")


def parse_json(body: bytes) -> Any:
    if not body:
        raise HTTPError(400, "EmptyBody", "a JSON body is needed")
    try:
        return json.loads(body, parse_constant=_not_json)
    except RecursionError:
        raise HTTPError(400, "MalformedJSON", "the JSON is nested too deeply") from None
    except ValueError as exc:
        raise HTTPError(400, "MalformedJSON", f"the body is not valid JSON: {exc}") from None


def ok(data: Any, status: int = 200) -> tuple[int, bytes, str]:
    return status, dump(data), "application/json"


def dump(data: Any) -> bytes:
    return json.dumps(data).encode()


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def path_of(scope: Scope) -> str:
    """The path as sent, for routing: an encoded "/" (%2F) inside a name stays in the name
    (and fails its pattern) instead of making a path the document does not have."""
    raw = scope.get("raw_path")
    if raw is None:
        return str(scope["path"])
    return bytes(raw).decode("latin-1").partition("?")[0]


def route_token(token: str) -> str:
    """The token a daemon of API token `token` gives its replicas: it reads the watch (the
    routes their handles follow) and nothing else. Made from the API token, so that daemons of
    one store (one token) take each other's; it says nothing of the token itself."""
    return hmac.new(token.encode(), b"controller route token v1", hashlib.sha256).hexdigest()
