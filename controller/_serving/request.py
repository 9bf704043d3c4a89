"""What a handler is called with: one HTTP request, read the way a Starlette or Ray Serve user
reads one (``request.method``, ``.url.path``, ``.query_params``, ``.headers``, ``await
request.body()``, ``await request.json()``, ``request.stream()``). Made per request and cheap:
the query and the headers are parsed only when first asked for."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, NamedTuple, final
from urllib.parse import parse_qsl, unquote

#: The largest body read whole (``body()``, ``json()``, and before a sync handler is called):
#: 413 beyond. ``stream()`` reads a body of any size a piece at a time.
MAX_BODY_BYTES = 100 << 20


class BodyTooLarge(Exception):
    """A body read whole is over `MAX_BODY_BYTES` (the server answers 413)."""


class Address(NamedTuple):
    """Where a request came from: its connection's peer (the ingress, for a routed request;
    ``x-forwarded-for`` names the client)."""

    host: str
    port: int


@final
class Headers(Mapping[str, str]):
    """A request's headers, by name in any case (``request.headers["content-type"]``). A name
    sent more than once maps to its first value; ``getlist`` gives them all."""

    __slots__ = ("_first", "_raw")

    def __init__(self, raw: list[tuple[bytes, bytes]]):
        self._raw = raw
        """As read: names in lower case, values as sent."""
        self._first: dict[str, str] | None = None

    def _index(self) -> dict[str, str]:
        if self._first is None:
            first: dict[str, str] = {}
            for name, value in self._raw:
                first.setdefault(name.decode("latin-1"), value.decode("latin-1"))
            self._first = first
        return self._first

    def __getitem__(self, name: str) -> str:
        return self._index()[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index())

    def __len__(self) -> int:
        return len(self._index())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._index()

    def getlist(self, name: str) -> list[str]:
        key = name.lower().encode("latin-1")
        return [v.decode("latin-1") for n, v in self._raw if n == key]

    @property
    def raw(self) -> list[tuple[bytes, bytes]]:
        """Every (name, value) as bytes, in the order sent (names in lower case)."""
        return list(self._raw)

    def __repr__(self) -> str:
        return f"Headers({self._index()!r})"


@final
class QueryParams(Mapping[str, str]):
    """A request's query (``?a=1&b=2&b=3``): ``params["a"]``, ``params.get("b")`` (its first
    value), ``params.getlist("b")`` (every value), in the order sent."""

    __slots__ = ("_first", "_pairs")

    def __init__(self, query: str):
        self._pairs = parse_qsl(query, keep_blank_values=True)
        self._first: dict[str, str] = {}
        for key, value in self._pairs:
            self._first.setdefault(key, value)

    def __getitem__(self, key: str) -> str:
        return self._first[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._first)

    def __len__(self) -> int:
        return len(self._first)

    def getlist(self, key: str) -> list[str]:
        return [v for k, v in self._pairs if k == key]

    def multi_items(self) -> list[tuple[str, str]]:
        return list(self._pairs)

    def __repr__(self) -> str:
        return f"QueryParams({self._pairs!r})"


@final
class URL:
    """The request's URL as the client asked for it: ``path`` (percent-decoded), ``query`` (as
    sent), ``scheme``, ``netloc``; ``str(url)`` is the whole of it."""

    __slots__ = ("netloc", "path", "query", "raw_path", "scheme")

    def __init__(self, scheme: str, netloc: str, raw_path: str, query: str):
        self.scheme = scheme
        self.netloc = netloc
        self.raw_path = raw_path
        """The path as sent (percent-encoded)."""
        self.path = unquote(raw_path) if "%" in raw_path else raw_path
        self.query = query

    def __str__(self) -> str:
        query = f"?{self.query}" if self.query else ""
        return f"{self.scheme}://{self.netloc}{self.raw_path}{query}"

    def __repr__(self) -> str:
        return f"URL({str(self)!r})"


#: How the server hands a request's body over: the next piece, or None at its end.
BodyReader = Callable[[], Awaitable[bytes | None]]


@final
class Request:
    """One HTTP request to a handler.

    Async handlers read the body with ``await request.body()`` (whole), ``await
    request.json()``, or ``async for chunk in request.stream()`` (as it arrives). A sync handler
    (which runs in a thread) is called once the body has arrived: ``request.content`` holds it.
    """

    __slots__ = (
        "_body",
        "_clock",
        "_deadline",
        "_headers",
        "_query",
        "_read",
        "_read_started",
        "_url",
        "client",
        "method",
        "path_params",
        "raw_headers",
        "root_path",
        "target",
    )

    def __init__(
        self,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        client: Address,
        read: BodyReader | None,
        *,
        root_path: str = "",
        deadline: float = math.inf,
        clock: Callable[[], float] | None = None,
    ):
        self.method = method
        """``GET``, ``POST``, ... as sent."""
        self.target = target
        """The request target as sent (path and query, origin form)."""
        self.raw_headers = headers
        self.client = client
        self.root_path = root_path
        """The route prefix the request came in under (the ingress's ``x-forwarded-prefix``),
        or ``""``: ``url.path`` starts with it."""
        self.path_params: dict[str, Any] = {}
        """For routers of your own to fill; empty as made."""
        self._read = read
        self._read_started = False
        self._body: bytes | None = None if read is not None else b""
        self._deadline = deadline
        self._clock = clock
        self._headers: Headers | None = None
        self._query: QueryParams | None = None
        self._url: URL | None = None

    # -- the head --

    @property
    def url(self) -> URL:
        if self._url is None:
            path, _, query = self.target.decode("latin-1").partition("?")
            netloc = self.headers.get("host", "")
            self._url = URL("http", netloc, path, query)
        return self._url

    @property
    def path(self) -> str:
        """The path, percent-decoded (``url.path``)."""
        return self.url.path

    @property
    def query_params(self) -> QueryParams:
        if self._query is None:
            self._query = QueryParams(self.url.query)
        return self._query

    @property
    def headers(self) -> Headers:
        if self._headers is None:
            self._headers = Headers(self.raw_headers)
        return self._headers

    @property
    def cookies(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for value in self.headers.getlist("cookie"):
            for part in value.split(";"):
                name, eq, rest = part.strip().partition("=")
                if eq and name:
                    out.setdefault(name, rest.strip().strip('"'))
        return out

    def time_left(self) -> float:
        """Seconds left before the request's deadline (its backend's ``request_timeout_s``, or
        what its caller had left, whichever ends first); past it, the handler is cancelled.
        Callable from a sync handler's thread too."""
        if self._clock is None or self._deadline == math.inf:
            return math.inf
        return self._deadline - self._clock()

    # -- the body --

    @property
    def content(self) -> bytes:
        """The whole body, once read (always, in a sync handler); in an async handler, ``await
        request.body()`` first."""
        if self._body is None:
            raise RuntimeError(
                "the request body has not been read yet: `await request.body()` first (a sync "
                "handler is called with it read)"
            )
        return self._body

    async def body(self) -> bytes:
        """The whole body (read once, then kept): 413 to the client if it is over
        `MAX_BODY_BYTES` (read it with ``stream()`` instead)."""
        if self._body is None:
            parts: list[bytes] = []
            size = 0
            async for chunk in self.stream():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise BodyTooLarge(f"the request body is over {MAX_BODY_BYTES} bytes")
                parts.append(chunk)
            self._body = b"".join(parts)
        return self._body

    async def json(self) -> Any:
        """The body parsed as JSON (``ValueError`` if it is not: a 500 unless caught)."""
        return json.loads(await self.body())

    async def stream(self) -> AsyncIterator[bytes]:
        """The body a piece at a time, as it arrives (once: a body read whole is given whole)."""
        if self._body is not None:
            if self._body:
                yield self._body
            return
        if self._read_started:
            raise RuntimeError("the request body has already been streamed")
        self._read_started = True
        assert self._read is not None
        while (chunk := await self._read()) is not None:
            if chunk:
                yield chunk

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.target.decode('latin-1')!r}>"
