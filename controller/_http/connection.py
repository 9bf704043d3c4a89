"""One client connection, served by one task: read a request, have the handler serve it (the
ingress's proxy, or a replica's own server), read the next.

Everything the connection waits for has one deadline at a time, kept by the server's `Timers`
(no cancel scope is made per request): a new connection's first byte and a request's head
(``header_timeout_s``), a body that must not stall (``body_timeout_s``), the answer (the
handler's deadlines: a replica's, a request's), an idle keep-alive connection
(``keepalive_timeout_s``). A deadline that passes cancels the connection's one scope, naming the
phase it was in; the handler then says so to the client if it still can (408, 502, 504) and the
connection closes. The task reads only when it needs the next request or the next piece of a
body, so a client is read no faster than its requests are served, and the server's `Hangups`
tells it at once of a client that hangs up, which cancels the request under way: at the
ingress, and so at the replica, whose own connection's client (the ingress) has hung up too.
"""

from __future__ import annotations

import math
import socket
from typing import Protocol, final

import trio

from .admission import Admission
from .errors import ClientGone, Reply
from .framing import END, Problem, RequestHead, RequestReader
from .hangups import Hangups
from .limits import ConnectionLimits
from .sockets import READ_SIZE, close, send_all
from .timers import Timers

#: After an answer that leaves part of the request unread, how long (and how much) of what
#: the client still sends is read and dropped before the connection closes.
LINGER_S = 2.0
LINGER_BYTES = 4 << 20
#: Once the server closes, how long a connection waiting for a request may take to send it.
CLOSING_GRACE_S = 1.0


class Handler(Protocol):
    """What serves a client's requests (the ingress's proxy, a replica's server)."""

    async def exchange(self, conn: Connection, head: RequestHead) -> bool:
        """Serve one request; whether the connection may carry the next one."""
        ...

    async def refuse(self, conn: Connection, problem: Problem) -> None:
        """Answer a request that cannot be read (then the connection closes)."""
        ...

    async def expired(self, conn: Connection, phase: str) -> None:
        """Say what ran out of time, if nothing of an answer was sent yet."""
        ...


@final
class Connection:
    """A client's connection: `serve` runs it until it ends; `evict` ends it from outside."""

    def __init__(
        self,
        sock: socket.socket,
        peer: str,
        limits: ConnectionLimits,
        handler: Handler,
        admission: Admission,
        timers: Timers,
        hangups: Hangups,
    ):
        self.sock = sock
        self.peer = peer
        self.limits = limits
        self._handler = handler
        self._admission = admission
        self._hangups = hangups
        self._reader = RequestReader(limits.max_target_bytes, limits.max_header_bytes)
        self._events = self._reader.events
        self.scope = trio.CancelScope()
        """The connection's: cancelled when a deadline passes, it is evicted, or its client
        hangs up."""
        self.deadline = math.inf
        self.request_deadline = math.inf
        """The current request's own deadline (its backend's ``request_timeout_s``, or its
        caller's), which no phase's deadline outlasts: past it, the phase is ``deadline``."""
        self.phase = "idle"
        """What the deadline is for: idle, head, body, send, or one of the handler's (the
        ingress's request, deadline and upstream)."""
        self.timer = timers.timer(self)
        self.expired_in: str | None = None
        """The phase whose deadline passed."""
        self.gone = False
        """The client hung up."""
        self.requests = 0
        """Requests read so far."""
        self.current: RequestHead | None = None
        """The request under way."""
        self.answered: int | None = None
        """The status of the answer whose head went out for the current request."""
        self.upstream = ""
        """Where the current request went, if it went on (the ingress: for what a timeout
        says)."""
        self.waited_s: float | None = None
        """How long its answer took to begin, once the request was sent on (the ingress: what a
        canary's latency gate counts, not the connection's setup, nor the client's reading)."""
        self._idle = False
        self._unread = False
        """Closing with some of what the client sent unread: linger (`_linger`)."""
        # The body's rate, judged in windows of the client's time (``body``).
        self._body_waited = 0.0
        self._window_end = 0.0
        self._window_need = 0
        """Of the current request's body: bytes taken, and seconds spent waiting for them."""

    async def serve(self) -> None:
        """Serve the connection until it closes, idles out, errs or is evicted."""
        self._hangups.watch(self.sock, self)
        try:
            with self.scope:
                await self._serve_requests()
            if self.expired_in is not None and not self.gone:
                await self._handler.expired(self, self.expired_in)
                self._unread = self.expired_in != "idle"  # an idle one was told nothing
            if self._unread and not self.gone:
                await self._linger()
        finally:
            self.timer.cancel()
            self._hangups.forget(self.sock)
            if self._idle:
                self._admission.idle(self, False)
            self._admission.leave(self.peer, self)
            close(self.sock)

    async def _serve_requests(self) -> None:
        while True:
            event = await self._next_request()
            if event is None:
                return
            if isinstance(event, Problem):
                await self._handler.refuse(self, event)
                self._unread = True  # what it sent after the fault was never read
                return
            self.requests += 1
            self.current, self.answered, self.upstream = event, None, ""
            self.request_deadline = math.inf
            self.timer.set(math.inf, "request")
            try:
                keep = await self._handler.exchange(self, event)
            except ClientGone:
                return  # it hung up, or stopped reading its answer
            if self.scope.cancel_called:
                # Its deadline passed as its answer went out whole (the cancellation comes at
                # the next checkpoint): the connection ends here, its answer standing. Later,
                # with `answered` cleared, it would be answered again (a 504 nobody asked for,
                # read by the connection's next request).
                return
            if not keep or not event.keep_alive:
                self._unread = not event.complete
                return
            self.current, self.answered, self.upstream = None, None, ""
            if self._admission.closing:
                return

    async def _linger(self) -> None:
        """Close the sending side, then read and drop what the client still sends, for at
        most `LINGER_S`: closing a socket with unread bytes resets it, and the reset can
        overtake the answer just sent (a client uploading a body it was refused would see a
        reset instead of its 404)."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return
        with trio.move_on_after(LINGER_S):
            dropped = 0
            while dropped < LINGER_BYTES:
                await trio.lowlevel.wait_readable(self.sock)
                try:
                    data = self.sock.recv(READ_SIZE)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                dropped += len(data)

    def arm(self, when: float, phase: str) -> None:
        """The connection expires at `when` in `phase`, or at the request's own deadline if
        that comes first."""
        if self.request_deadline <= when:
            self.timer.set(self.request_deadline, "deadline")
        else:
            self.timer.set(when, phase)

    def expire(self, phase: str) -> None:
        """(The timers) the deadline of `phase` has passed."""
        self.expired_in = phase
        self.scope.cancel()

    def hang_up(self) -> None:
        """(The hang-up watch) the client has closed its side, or reset the connection."""
        self.gone = True
        self.scope.cancel()

    @property
    def closing(self) -> bool:
        """The server is closing: this connection ends after the request under way."""
        return self._admission.closing

    def closing_now(self) -> None:
        """(The server is closing; this connection waits for a request.) A request already
        in its socket, or, on a connection just accepted, on its way (its client would not
        send it again on a new connection) is answered, with ``Connection: close``; else the
        connection closes: a kept one at once (its client sends again elsewhere), a new one
        after `CLOSING_GRACE_S`."""
        if not self._idle:
            return
        try:
            waiting = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            waiting = False
        except OSError:
            waiting = False  # reset: closed below, as it is gone
        if self.requests and not waiting:
            self.evict()
        else:
            self.timer.set(min(self.deadline, trio.current_time() + CLOSING_GRACE_S), "idle")

    def evict(self) -> None:
        """Close the connection (it is idle, and another needs its room)."""
        self.scope.cancel()

    async def _next_request(self) -> RequestHead | Problem | None:
        """The next request's head (read now, or already there: pipelined), a `Problem`, or
        None if the client is done (it closed)."""
        events, reader = self._events, self._reader
        if not events:
            limits, sock = self.limits, self.sock
            now = trio.current_time()
            head_by = now + limits.header_timeout_s
            if reader.in_head:
                # Begun behind an earlier request (pipelined): it must arrive whole in time.
                self.timer.set(head_by, "head")
            else:
                # A new connection must begin its request as soon as a head must arrive whole.
                first = self.requests == 0
                wait = limits.header_timeout_s if first else limits.keepalive_timeout_s
                if self._admission.closing:
                    wait = min(wait, CLOSING_GRACE_S)  # accepted as the server closed
                self.timer.set(now + wait, "idle")
                self._admission.idle(self, True)
                self._idle = True
            # Other tasks run first, and only then is the socket tried: under load, a kept
            # connection's next request is in by then, and need not be waited for with epoll.
            await trio.lowlevel.checkpoint()
            while not events:
                try:
                    data = sock.recv(READ_SIZE)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(sock)
                    continue
                except OSError:
                    data = b""
                if not data:
                    return None
                if self._idle:
                    self._admission.idle(self, False)
                    self._idle = False
                    head_by = trio.current_time() + limits.header_timeout_s
                reader.feed(data)
                if not events:
                    # A head begun and not whole: the rest must come by its deadline.
                    self.timer.set(head_by, "head")
        event = events.popleft()
        if isinstance(event, RequestHead):
            reader.queued_heads -= 1
            self._body_waited = 0.0
            self._next_window()
            return event
        if isinstance(event, Problem):
            return event
        return Problem(400, "BadRequest", "a request body with no request")  # cannot happen

    async def body(self) -> bytes | None:
        """The next chunk of the current request's body; None at its end. Raises `Reply`
        (400) if it cannot be read, ``ClientGone`` if the client left."""
        events, limits = self._events, self.limits
        while not events:
            now = trio.current_time()
            wait = limits.body_timeout_s
            if limits.min_body_rate:
                # What is left of the window the client must bring its bytes in.
                wait = min(wait, max(0.0, self._window_end - self._body_waited))
            self.arm(now + wait, "body")
            await trio.lowlevel.wait_readable(self.sock)
            self._body_waited += trio.current_time() - now
            try:
                data = self.sock.recv(READ_SIZE)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                raise ClientGone
            self._reader.feed(data)
            if events:
                # What waits for the body next (a handler, a replica) keeps its own time.
                self.timer.set(self.request_deadline, "deadline")
        event = events.popleft()
        if isinstance(event, bytes):
            self._window_need -= len(event)
            if self._window_need <= 0:
                self._next_window()
            return event
        if event is END:
            return None
        if isinstance(event, Problem):
            raise Reply(event.status, event.kind, str(event))
        raise Reply(400, "BadRequest", "a request began before the body ended")  # cannot happen

    def _next_window(self) -> None:
        """A window of the body's rate begins now, in the client's time: a fast start earns
        no credit for a trickle after it."""
        limits = self.limits
        self._window_end = self._body_waited + limits.body_rate_window_s
        self._window_need = int(limits.min_body_rate * limits.body_rate_window_s)

    def skip_body(self) -> bool:
        """Drop what has arrived of the current request's body, without waiting; whether its
        end was among it (else the connection cannot carry another request)."""
        events = self._events
        while events:
            event = events[0]
            if not isinstance(event, bytes) and event is not END:
                return False
            events.popleft()
            if event is END:
                return True
        return False

    async def send(self, data: bytes | bytearray) -> None:
        """Send to the client, which must take it within body_timeout_s. ``ClientGone`` if it
        has left."""
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            raise ClientGone from None
        if sent == len(data):
            return
        self.arm(trio.current_time() + self.limits.body_timeout_s, "send")
        try:
            await send_all(self.sock, memoryview(data)[sent:])
        except OSError:
            raise ClientGone from None
        self.timer.set(self.request_deadline, "deadline")
