"""One request's way through the ingress: route it, hold a replica slot for it, send it on a
pooled connection, and relay the answer. Bodies stream both ways chunk by chunk.

Every slot taken is given back in the ``finally`` after the take, whatever happens (a failed send,
a bad answer, a client hanging up, a deadline, a bug): the load reported is what is under way."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Protocol, final

import trio

from .._http.answers import (
    LAST_CHUNK,
    ResponseHead,
    ResponseReader,
    error_body,
    own_answer,
    pass_on,
    response_head,
)
from .._http.connection import Connection
from .._http.errors import ClientGone, Reply
from .._http.framing import Problem, RequestHead
from .._http.ratelimit import RateLimitedLog
from .._http.sockets import receive_upstream, send_all
from .._routing.choice import RouteTable
from .._routing.models import HELD_HEADER, requested_model, take_header
from .._routing.policy import session_key
from .._routing.split import Side, choose_side
from .._routing.table import BackendRoutes, Rejected, Slot
from .._routing.upstream import Lost, NotSent, Pool, Stale, Upstream
from ._config import IngressConfig
from ._deadlines import EXPIRED_STATUS, expired_answer, start_deadline
from ._metrics import IngressMetrics
from ._policies import admit, retry
from ._uploads import Uploads
from ._wire import upstream_head

logger = logging.getLogger("controller.ingress")

#: How soon a client told "no room" may try again, in seconds.
RETRY_AFTER_S = 1
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NONE_TRIED: frozenset[str] = frozenset()
#: What a ``Reply`` carries for the ingress, not for the client's body.
_NOT_SAID = frozenset({"cause", "retry_after"})
#: Requests that may be sent twice (RFC 9110 9.2.2, less PUT and DELETE, whose effects a
#: replica may not make idempotent): sent again once when a kept connection proves closed.
_REPEATABLE = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE"})


class Routing(Protocol):
    """What the proxy reads of its ingress."""

    @property
    def table(self) -> RouteTable: ...

    def backend(self, name: str) -> BackendRoutes | None: ...

    def builtin(self, path: str) -> tuple[int, bytes, bytes] | None:
        """The answer to an ingress path (``/-/...``): status, content type, body."""
        ...


@final
class Proxy:
    def __init__(
        self, routing: Routing, pool: Pool, config: IngressConfig, metrics: IngressMetrics
    ):
        self.routing = routing
        self.pool = pool
        self.config = config
        self.metrics = metrics
        self.uploads = Uploads(config)
        self.warnings = RateLimitedLog(logger)

    # -- what a client connection asks --

    async def exchange(self, client: Connection, head: RequestHead) -> bool:
        """Serve `head` to `client`; whether its connection may carry another request."""
        started = trio.current_time()
        path = head.path
        if path.startswith("/-/"):
            builtin = self.routing.builtin(path)
            if builtin is None:
                message = "paths under /-/ are the ingress's own"
                return await self._own(client, head, 404, "NoRoute", message)
            return await self._answer(client, head, *builtin)
        table = self.routing.table
        name = table.match(path)
        backend = self.routing.backend(name) if name is not None else None
        if name is None or backend is None:
            routes = dict(sorted(table.routes.items()))
            keep = await self._own(
                client, head, 404, "NoRoute", f"no route for {path}", routes=routes
            )
            self.metrics.done(head, client.peer, "-", "-", 404, started)
            return keep
        route = backend.route_prefix
        status = 499  # as nginx logs it: the client closed the connection first
        try:
            admit(backend, head, client.peer)
            status, keep = await self._forward(client, head, backend)
            return keep
        except ClientGone:
            return False
        except Reply as reply:
            status = reply.status
            if reply.status in (429, 503) and "cause" in reply.extra:
                self.metrics.rejected(name, reply.extra["cause"])
            elif reply.status >= 500:
                self.warnings.warn(
                    f"{reply.kind}:{name}",
                    "backend %s: %d %s: %s",
                    *(name, reply.status, reply.kind, reply),
                )
            extra = {k: v for k, v in reply.extra.items() if k not in _NOT_SAID}
            retry_after = reply.extra.get("retry_after")
            if retry_after is None and reply.status == 503:
                retry_after = RETRY_AFTER_S
            return await self._own(
                client, head, reply.status, reply.kind, str(reply), retry_after=retry_after, **extra
            )
        finally:
            if client.expired_in is not None:
                status = client.answered or EXPIRED_STATUS.get(client.expired_in, status)
            self.metrics.done(head, client.peer, name, route, status, started)

    async def refuse(self, client: Connection, problem: Problem) -> None:
        """Answer a request the client's reader could not read; the connection then closes."""
        self.metrics.bad_request(problem.status)
        body = error_body(problem.kind, str(problem))
        with contextlib.suppress(ClientGone):
            await client.send(own_answer(problem.status, b"application/json", body, close=True))

    async def expired(self, client: Connection, phase: str) -> None:
        """A deadline passed (the connection's scope is cancelled): say so, if nothing of an
        answer went out yet, and the connection closes."""
        said = expired_answer(phase, self.config, client.upstream)
        if said is None or client.answered is not None:
            return  # idle (closed without a word), or an answer under way (cut short)
        status, kind, message = said
        if phase == "head":
            self.metrics.bad_request(status)
        answer = own_answer(status, b"application/json", error_body(kind, message), close=True)
        with trio.move_on_after(self.config.body_timeout_s), contextlib.suppress(ClientGone):
            await client.send(answer)

    # -- forwarding --

    async def _forward(
        self, client: Connection, head: RequestHead, backend: BackendRoutes
    ) -> tuple[int, bool]:
        model = requested_model(head.headers)  # a bad one is refused before the body is read
        deadline = start_deadline(client, head, backend)
        if not head.body:
            return await self._send(client, head, backend, deadline, model)
        limit = self.config.buffer_body_bytes
        if head.length is not None and head.length > limit:
            body, whole = b"", False  # an upload: known as one before a byte of it is read
        else:
            # A body read whole before a replica's slot is taken: a client that sends it
            # slowly holds no slot meanwhile, and it goes on with its head in one write.
            body, whole = await self._read_body(client, head, limit)
        if whole:
            return await self._send(client, head, backend, deadline, model, body)
        with self.uploads.held(backend.name, client.peer):
            return await self._send(client, head, backend, deadline, model, body, upload=True)

    async def _send(
        self,
        client: Connection,
        head: RequestHead,
        backend: BackendRoutes,
        deadline: float,
        model: str | None,
        body: bytes = b"",
        *,
        upload: bool = False,
    ) -> tuple[int, bool]:
        """Send `head` to a replica, and its `body`: whole, or (an `upload`) what was read of
        it, the rest as it arrives."""
        repeatable = not head.body and head.method in _REPEATABLE
        tried: frozenset[str] = _NONE_TRIED
        split = backend.split
        side = None if split is None else choose_side(split, head.headers, backend.rng)
        key = session_key(backend.affinity, head.headers)
        if model is not None:
            backend.asked(model)
        # What goes after the head: a whole body by its length (chunks read are sent as one
        # body), or the first part of an upload in its own framing.
        length = len(body) if head.body and not upload else None
        first = b"%x\r\n%s\r\n" % (len(body), body) if upload and head.chunked and body else body
        # An upload known by its length is sent no 100 Continue until its replica has the
        # head (it would send what no replica may take); one read in part has been sent it.
        expect = upload and not body and head.expect_continue
        retrying = False  # counted in the backend's retry budget until the request ends
        try:
            while True:
                slot = backend.take_upload(tried, side) if upload else None
                counted_apart = slot is not None
                if slot is None:
                    slot = await self._acquire(backend, tried, side, key, model)
                taken_at, client.waited_s = trio.current_time(), None
                # What the gates of a canary release count: an answer's status, or none at all
                # (a timeout, a 502) as an error; a request tried again elsewhere, or one whose
                # client left, not at all.
                outcome: int | None = 599
                try:
                    left_ms = max(1, int((deadline - trio.current_time()) * 1000))
                    # The side the request reached (not the one drawn: a side with no room, or
                    # none serving yet, gives another replica), which its calls keep to.
                    reached = backend.side_of(slot)
                    sent = upstream_head(
                        head, client.peer, backend, slot.address, left_ms, reached, length, upload
                    )
                    status, keep = await self._through(
                        client, head, backend, slot, sent + first, repeatable, upload, expect
                    )
                    outcome = status
                    return status, keep
                except Reply as reply:
                    outcome = reply.status
                    raise
                except ClientGone:
                    outcome = None
                    raise
                except Stale:
                    outcome = None
                    # The replica had closed that kept connection (or died): its other kept
                    # ones go too, and the request goes again, once, on a new connection.
                    self.pool.forget(slot.address)
                    repeatable = False
                except NotSent as exc:
                    outcome = None
                    backend.refused(slot)
                    self.pool.forget(slot.address)  # its kept connections are as dead
                    tried = tried | {slot.tag}
                    retrying = retry(backend, tried, retrying, exc)
                    logger.debug("backend %s: %s; trying another replica", backend.name, exc)
                finally:
                    if outcome is not None and not client.gone:  # (a hang-up is no answer)
                        waited = client.waited_s
                        seconds = trio.current_time() - taken_at if waited is None else waited
                        backend.count(slot, outcome >= 500, seconds, client.peer)
                    if counted_apart:
                        backend.release_upload(slot)
                    else:
                        backend.release(slot)
                    if slot.gone and not slot.in_flight and not slot.uploads:
                        # The last request to a replica that left: what was pooled for it
                        # before it left goes too (the snapshot that took it away could not
                        # close those).
                        self.pool.forget(slot.address)
        finally:
            if retrying:
                backend.retry_done()

    async def _acquire(
        self,
        backend: BackendRoutes,
        tried: frozenset[str],
        side: Side | None,
        key: bytes | None,
        model: str | None,
    ) -> Slot:
        slot = backend.try_acquire(tried, side, key, model)
        if slot is not None:
            return slot
        try:
            with trio.fail_after(self.config.queue_timeout_s):
                return await backend.wait(tried, key, model)
        except trio.TooSlowError:
            message = (
                f"no replica of backend {backend.name!r} had room within queue_timeout_s="
                f"{self.config.queue_timeout_s:g}"
            )
            raise Reply(503, "QueueTimeout", message, cause="queue_timeout") from None
        except Rejected as exc:
            if tried and exc.cause == "no_replicas":
                message = f"every replica of backend {backend.name!r} tried refused the connection"
                raise Reply(502, "BadGateway", message) from None
            kind = {"queue_full": "Overloaded", "no_replicas": "NoReplicas"}[exc.cause]
            raise Reply(503, kind, str(exc), cause=exc.cause) from None

    async def _through(
        self,
        client: Connection,
        head: RequestHead,
        backend: BackendRoutes,
        slot: Slot,
        sent: bytes,
        repeatable: bool,
        streamed: bool,
        expect: bool = False,
    ) -> tuple[int, bool]:
        """The request to the replica of `slot` (`sent`: its head, and its body, or what was
        read of it if the rest is `streamed`, once the client is told to `expect` to send it), and
        its answer to the client. ``NotSent`` while nothing reached the
        replica (``Lost``: one that may be sent twice, closed unanswered); ``Stale`` for a
        `repeatable` one whose kept connection proved closed."""
        upstream = await self.pool.get(slot.address, check=not repeatable)
        client.upstream = upstream.address
        try:
            try:
                await send_all(upstream.sock, sent)
            except OSError as exc:
                raise NotSent(f"connection to {slot.address} lost: {exc}") from None
            whole = True
            if head.body:
                upstream.body_sent = True
            if streamed:
                if expect:
                    await client.send(_CONTINUE)
                whole = await self._send_body(client, upstream, head.chunked)
            return await self._relay(client, head, backend, slot, upstream, repeatable, whole)
        finally:
            if slot.gone:
                upstream.reusable = False
            self.pool.put(upstream)  # or closed, if it cannot carry another request

    async def _read_body(
        self, client: Connection, head: RequestHead, limit: int
    ) -> tuple[bytes, bool]:
        """The body of `head`, read before anything goes to a replica: whole (True), or, once
        more than `limit` bytes came, what came so far (False: the rest is streamed)."""
        if head.expect_continue:
            await client.send(_CONTINUE)
        body = bytearray()
        while (chunk := await client.body()) is not None:
            body += chunk
            if len(body) > limit:
                return bytes(body), False
        return bytes(body), True

    async def _send_body(self, client: Connection, upstream: Upstream, chunked: bool) -> bool:
        """Stream the rest of the body to the replica; whether all of it went (False: the
        replica closed the connection first, which an early answer may explain)."""
        while True:
            chunk = await client.body()
            if chunk is None:
                data = LAST_CHUNK if chunked else b""
            elif chunked:
                data = b"%x\r\n%s\r\n" % (len(chunk), chunk)
            else:
                data = chunk
            if data:
                try:
                    sent = upstream.sock.send(data)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    return False
                if sent < len(data):
                    # The replica must take the rest within body_timeout_s.
                    deadline = trio.current_time() + self.config.body_timeout_s
                    client.arm(deadline, "upstream")
                    try:
                        await send_all(upstream.sock, memoryview(data)[sent:])
                    except OSError:
                        return False
            if chunk is None:
                return True

    async def _relay(
        self,
        client: Connection,
        head: RequestHead,
        backend: BackendRoutes,
        slot: Slot,
        upstream: Upstream,
        repeatable: bool,
        whole: bool = True,
    ) -> tuple[int, bool]:
        """Wait for the replica's answer (within request_timeout_s, then each next part of it
        within the same) and pass it on."""
        timeout, sock = self.config.request_timeout_s, upstream.sock
        reader = ResponseReader()
        reader.head_only = head.method == b"HEAD"
        events = reader.events
        sent_at = trio.current_time()
        client.arm(sent_at + timeout, "request")
        answer: ResponseHead | None = None
        try:
            while answer is None:
                data = await receive_upstream(sock)
                if not data:
                    if repeatable and upstream.reused and not reader.began:
                        raise Stale
                    how = "without answering" if whole else "while the request was sent"
                    message = f"the replica at {upstream.address} closed the connection {how}"
                    if not reader.began and not head.body and head.method in _REPEATABLE:
                        raise Lost(message)  # it died with the request: another one takes it
                    raise Reply(502, "BadGateway", message)
                try:
                    reader.feed(data)
                except Problem as problem:
                    raise Reply(problem.status, problem.kind, str(problem)) from None
                if events:
                    first = events.popleft()
                    assert isinstance(first, ResponseHead)
                    answer = first
        finally:
            client.waited_s = trio.current_time() - sent_at
            if not client.gone:
                backend.answered(slot, client.waited_s)  # a timeout counts
        held = take_header(answer.headers, HELD_HEADER)
        if held is not None:
            backend.heard(slot, held)
        # The client's framing: the replica's length where it gave one; else chunks, or, for
        # an HTTP/1.0 client (which cannot read chunks), the connection's end.
        sized = answer.length is not None
        chunks = not sized and not head.http_10
        # An answer before the whole body went (an early 413, say): the rest of the body is
        # not read, so the connection closes after the answer; so it does if the ingress stops.
        keep = head.keep_alive and (sized or chunks) and whole and head.complete
        keep = keep and not client.closing
        out = bytearray(response_head(answer, chunked=chunks, close=not keep))
        client.answered = answer.status
        # From here on the client has the head: a failure can only cut the answer short. What
        # the replica has sent already goes with it, in one write: a small answer is one.
        done = pass_on(events, out, chunks)
        await client.send(out)
        while not done:
            client.arm(trio.current_time() + timeout, "request")
            data = await receive_upstream(sock)
            if not data:
                if not reader.closed():
                    raise ClientGone  # cut mid-answer: the client sees it broken
            else:
                try:
                    reader.feed(data)
                except Problem:
                    raise ClientGone from None
            out = bytearray()
            done = pass_on(events, out, chunks)
            await client.send(out)
        upstream.reusable = (
            answer.keep_alive and reader.ended and not reader.extra and not upstream.body_sent
        )
        return answer.status, keep

    # -- answers of our own --

    async def _own(
        self,
        client: Connection,
        head: RequestHead,
        status: int,
        kind: str,
        message: str,
        *,
        retry_after: int | None = None,
        **extra: Any,
    ) -> bool:
        """Answer with an error of ours; whether the connection may carry another request."""
        headers = () if retry_after is None else ((b"retry-after", b"%d" % retry_after),)
        body = error_body(kind, message, **extra)
        return await self._answer(client, head, status, b"application/json", body, headers)

    async def _answer(
        self,
        client: Connection,
        head: RequestHead,
        status: int,
        content_type: bytes,
        body: bytes,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> bool:
        """An answer of the ingress's own, whole; whether the connection may carry another
        request (not if the request's body is still arriving: it is not read)."""
        keep = head.keep_alive and not client.closing and (not head.body or client.skip_body())
        client.answered = status
        head_only = head.method == b"HEAD"
        await client.send(
            own_answer(
                status, content_type, body, close=not keep, head_only=head_only, extra=headers
            )
        )
        # An answer that waited for nothing: let other tasks run before the next request.
        await trio.lowlevel.checkpoint()
        return keep
