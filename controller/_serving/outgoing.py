"""One answer on its way from a replica's handler to the client: its head once, then its body,
framed by length when it is known, else chunked (or, to an HTTP/1.0 client, by closing). An
answer to HEAD is its head alone, and so are 204 and 304, whatever body the handler gave: one
sent would be read as the next answer (RFC 9110 6.4.1); a 204 says no length either."""

from __future__ import annotations

from typing import final

from .._http.answers import LAST_CHUNK, served_head
from .._http.connection import Connection
from .._http.errors import ClientGone
from .._http.framing import RequestHead
from .._routing.models import HELD_HEADER
from .multiplex import Shelf


@final
class Outgoing:
    """The answer to `head` on `conn`. `keep` says whether the connection may carry the next
    request (the request was read whole, and nothing asked to close); the answer's head says
    so, and the server reads it back once the answer is sent."""

    __slots__ = (
        "_chunked",
        "_head_only",
        "_left",
        "_shelf",
        "conn",
        "done",
        "keep",
        "started",
        "status",
    )

    def __init__(self, conn: Connection, head: RequestHead, shelf: Shelf | None = None):
        self.conn = conn
        self._shelf = shelf
        """A multiplexed replica's models: every answer says what it holds (as it answers)."""
        self._head_only = head.method == b"HEAD"
        self.keep = head.keep_alive and not conn.closing
        self.started = False
        """The head has gone out: an error can only cut the answer short now."""
        self.done = False
        self.status = 0
        self._chunked = False
        self._left: int | None = None

    async def whole(
        self, status: int, headers: list[tuple[bytes, bytes]], body: bytes, *, keep: bool
    ) -> None:
        """The answer in one write."""
        self.keep = self.keep and keep
        self.started, self.done, self.status = True, True, status
        self.conn.answered = status
        headers = self._with_held(headers)
        if status in _NO_BODY:
            length = None if status == 204 else len(body)
            out = served_head(status, headers, length=length, close=not self.keep)
            await self.conn.send(out)
            return
        out = served_head(status, headers, length=len(body), close=not self.keep)
        await self.conn.send(out if self._head_only else out + body)

    async def begin(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        *,
        keep: bool,
        length: int | None = None,
        http_10: bool = False,
    ) -> None:
        """The head of an answer whose body follows in parts (`length`: their sum, if the
        handler said it)."""
        self.started, self.status = True, status
        self.conn.answered = status
        headers = self._with_held(headers)
        if status in _NO_BODY:
            # Its parts are dropped as they come; the head says nothing of them.
            self.keep = self.keep and keep
            self.done = True
            length = None if status == 204 else length
            await self.conn.send(served_head(status, headers, length=length, close=not self.keep))
            return
        self._left = length
        self._chunked = length is None and not http_10
        self.keep = self.keep and keep and (length is not None or self._chunked)
        if self._head_only:
            self.done = True
        # Framed by its length, else by chunks, else (an HTTP/1.0 client) by the connection's
        # end, which `keep` then rules out.
        out = served_head(
            status, headers, length=length, chunked=self._chunked, close=not self.keep
        )
        await self.conn.send(out)

    def _with_held(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        shelf = self._shelf
        if shelf is None or not shelf.multiplexed:
            return headers
        return [*headers, (HELD_HEADER, shelf.header())]

    async def part(self, data: bytes) -> None:
        """Send the next part of the body."""
        if self.done or not data:
            return
        if self._left is not None:
            if len(data) > self._left:
                # More than its Content-Length said: the rest would be read as an answer.
                raise ClientGone
            self._left -= len(data)
            await self.conn.send(data)
        elif self._chunked:
            await self.conn.send(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            await self.conn.send(data)

    async def end(self) -> None:
        """The body is complete."""
        if self.done:
            return
        self.done = True
        if self._left:
            raise ClientGone  # less than its Content-Length said: the client must see it cut
        if self._chunked:
            await self.conn.send(LAST_CHUNK)
        elif self._left is None:
            self.keep = False  # framed by the connection's end


#: Answers that never carry a body.
_NO_BODY = frozenset({204, 304})
