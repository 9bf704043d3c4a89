"""One client connection: read each request (h11), route it, hold a replica slot for it, send it
on a pooled connection, and stream the answer back. Bodies stream both ways chunk by chunk; a
client that hangs up cancels its request to the replica (its connection is closed)."""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Protocol, final

import attrs
import h11
import trio

from ._config import IngressConfig
from ._errors import ClientGone, Reply
from ._exchange import HOP_BY_HOP, READ_SIZE, Exchange
from ._metrics import IngressMetrics
from ._routing import RouteTable
from ._table import BackendRoutes, Rejected, Slot
from ._upstream import NotSent, Pool, Upstream

access_logger = logging.getLogger("controller.ingress.access")
logger = logging.getLogger("controller.ingress")

#: How soon a client told "no room" may try again, in seconds.
RETRY_AFTER_S = 1


class Routing(Protocol):
    """What the proxy reads of its ingress."""

    @property
    def table(self) -> RouteTable: ...

    def backend(self, name: str) -> BackendRoutes | None: ...

    def builtin(self, path: str) -> tuple[int, bytes, bytes] | None:
        """The answer to an ingress path (``/-/...``): status, content type, body."""
        ...


@final
@attrs.define(eq=False)
class Proxy:
    routing: Routing
    pool: Pool
    config: IngressConfig
    metrics: IngressMetrics

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        """Serve one client connection until it closes, errs or idles out."""
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.config.max_header_bytes)
        peer = _peer(stream)
        try:
            while True:
                request = await self._read_head(stream, conn)
                if request is None:
                    return
                await self._exchange(stream, conn, request, peer)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (ClientGone, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        except h11.ProtocolError as exc:
            logger.debug("client %s: %s", peer, exc)
        except Exception:
            # One connection never takes the ingress down with it: it is closed, and logged.
            logger.exception("ingress: connection from %s failed", peer)
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    # -- reading the request --

    async def _read_head(
        self, stream: trio.SocketStream, conn: h11.Connection
    ) -> h11.Request | None:
        """The next request's head, or None when the client is done (or idled out)."""
        config = self.config
        deadline = trio.current_time() + config.keepalive_timeout_s
        begun = False
        received = len(conn.trailing_data[0])  # a pipelined head may be held already
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                kind = {431: "HeadersTooLarge", 501: "NotImplemented"}.get(status, "BadRequest")
                await self._fail(stream, conn, status, kind, f"malformed request: {exc}")
                return None
            if isinstance(event, h11.Request):
                # h11 bounds a head that arrives in parts; one that arrives whole is measured
                # here, as the bytes it took (what h11 holds beyond it is the next request's).
                size = received - len(conn.trailing_data[0])
                if size > config.max_header_bytes:
                    message = f"the request head is over {config.max_header_bytes} bytes"
                    await self._fail(stream, conn, 431, "HeadersTooLarge", message)
                    return None
                return event
            if event is h11.NEED_DATA:
                with trio.move_on_at(deadline):
                    data = await stream.receive_some(READ_SIZE)
                    if data and not begun:
                        # A head has begun: it must arrive whole within header_timeout_s.
                        begun = True
                        deadline = min(deadline, trio.current_time() + config.header_timeout_s)
                    conn.receive_data(data)
                    received += len(data)
                    continue
                if begun:
                    message = (
                        f"the request head did not arrive within {config.header_timeout_s:g} s"
                    )
                    await self._fail(stream, conn, 408, "RequestTimeout", message)
                return None
            return None  # ConnectionClosed, or PAUSED after a protocol switch

    # -- one exchange --

    async def _exchange(
        self, stream: trio.SocketStream, conn: h11.Connection, request: h11.Request, peer: str
    ) -> None:
        started = trio.current_time()
        target = request.target
        path = _path_of(target)
        table = self.routing.table
        if path.startswith("/-/"):
            await _drain_body(stream, conn, self.config)
            builtin = self.routing.builtin(path)
            if builtin is None:
                await self._fail(
                    stream, conn, 404, "NoRoute", "paths under /-/ are the ingress's own"
                )
            else:
                await self._answer(stream, conn, *builtin)
            return
        name = table.match(path)
        backend = self.routing.backend(name) if name is not None else None
        if name is None or backend is None:
            await _drain_body(stream, conn, self.config)
            routes = dict(sorted(table.routes.items()))
            await self._fail(stream, conn, 404, "NoRoute", f"no route for {path}", routes=routes)
            self._done(request, peer, "-", "-", 404, started)
            return
        route = backend.route_prefix
        status = 502
        try:
            status = await self._forward(stream, conn, request, backend, route, peer)
        except ClientGone:
            status = 499  # as nginx logs it: the client closed the connection first
            raise
        except Reply as reply:
            status = reply.status
            if reply.status == 503:
                self.metrics.rejected.labels(name, reply.extra.get("cause", "")).inc()
            retry_after = RETRY_AFTER_S if reply.status == 503 else None
            extra = {k: v for k, v in reply.extra.items() if k != "cause"}
            await self._fail(
                stream, conn, reply.status, reply.kind, str(reply), retry_after=retry_after, **extra
            )
        finally:
            self._done(request, peer, name, route, status, started)

    async def _forward(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        request: h11.Request,
        backend: BackendRoutes,
        route: str,
        peer: str,
    ) -> int:
        config = self.config
        tried: set[str] = set()
        while True:
            slot = await self._acquire(backend, frozenset(tried))
            head = _upstream_request(request, peer, route, slot.address)
            try:
                upstream = await self._send_head(slot, head)
            except NotSent as exc:
                backend.refused(slot)
                backend.release(slot)
                tried.add(slot.tag)
                if len(tried) > config.max_retries:
                    raise Reply(502, "BadGateway", f"{exc}; tried {len(tried)} replicas") from None
                self.metrics.retries.labels(backend.name).inc()
                logger.debug("backend %s: %s; trying another replica", backend.name, exc)
                continue
            break
        kept = False
        try:
            exchange = Exchange(stream, conn, upstream, backend, slot, self.config)
            status = await exchange.run()
            if upstream.reusable and not slot.gone:
                await self.pool.put(upstream)
                kept = True
            return status
        finally:
            if not kept:
                await upstream.aclose()
            backend.release(slot)
            if slot.gone and not slot.in_flight:
                # The last request to a replica that left: what was pooled for it before it
                # left goes too (the snapshot that took it away could not close those).
                await self.pool.forget(slot.address)

    async def _acquire(self, backend: BackendRoutes, tried: frozenset[str]) -> Slot:
        slot = backend.try_acquire(tried)
        if slot is not None:
            return slot
        try:
            with trio.fail_after(self.config.queue_timeout_s):
                return await backend.wait(tried)
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

    async def _send_head(self, slot: Slot, head: h11.Request) -> Upstream:
        """Open (or reuse) a connection to `slot` and send the request's head. Whatever fails
        here reached no application: NotSent, and the caller tries another replica."""
        upstream = await self.pool.get(slot.address)
        try:
            await upstream.send(head)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            await upstream.aclose()
            raise NotSent(f"connection to {slot.address} lost: {exc}") from None
        return upstream

    async def _fail(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        status: int,
        kind: str,
        message: str,
        *,
        retry_after: int | None = None,
        **extra: Any,
    ) -> None:
        body = json.dumps({"error": {"type": kind, "message": message, **extra}}).encode()
        headers = [] if retry_after is None else [(b"retry-after", b"%d" % retry_after)]
        await self._answer(stream, conn, status, b"application/json", body, headers)

    async def _answer(
        self,
        stream: trio.SocketStream,
        conn: h11.Connection,
        status: int,
        content_type: bytes,
        body: bytes,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """An answer of the ingress's own, whole, in one write (given up on if the client does
        not take it within body_timeout_s)."""
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return  # a response is under way already: nothing more can be said
        headers = [
            (b"content-type", content_type),
            (b"content-length", b"%d" % len(body)),
            *(headers or []),
        ]
        if conn.their_state is not h11.DONE:
            headers.append((b"connection", b"close"))  # the rest of its request is not read
        try:
            data = conn.send(h11.Response(status_code=status, headers=headers))
            data += conn.send(h11.Data(data=body)) or b""
            data += conn.send(h11.EndOfMessage()) or b""
            with trio.move_on_after(self.config.body_timeout_s):
                await stream.send_all(data)
        except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    def _done(
        self, request: h11.Request, peer: str, backend: str, route: str, status: int, started: float
    ) -> None:
        elapsed = trio.current_time() - started
        if backend != "-":
            self.metrics.requests.labels(backend, route, str(status)).inc()
            self.metrics.latency.labels(backend).observe(elapsed)
        if self.config.access_log:
            method, target = request.method.decode("latin-1"), request.target.decode("latin-1")
            fields = {
                "peer": peer,
                "method": method,
                "target": target,
                "backend": backend,
                "status": status,
                "duration_ms": round(elapsed * 1000, 3),
            }
            access_logger.info(
                "%s %s %s -> %s %d %.1f ms",
                *(peer, method, target, backend, status, elapsed * 1000),
                extra={"fields": fields},
            )


async def _drain_body(
    stream: trio.SocketStream, conn: h11.Connection, config: IngressConfig
) -> None:
    """Read and drop a small request body we answer ourselves (404, built-ins); a large one is
    left unread and the connection closed after the answer."""
    if conn.they_are_waiting_for_100_continue:
        return  # it sends no body before a 100 it will not get: answered at once, then closed
    budget = 65536
    while conn.their_state is h11.SEND_BODY and budget > 0:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            with trio.move_on_after(config.body_timeout_s):
                data = await stream.receive_some(READ_SIZE)
                conn.receive_data(data)
                if data:
                    budget -= len(data)
                    continue
            return
        if isinstance(event, h11.ConnectionClosed):
            return


def _upstream_request(request: h11.Request, peer: str, route: str, address: str) -> h11.Request:
    """The head sent to the replica: the client's, less what belongs to the client's hop (and
    the headers its Connection header names), in origin form, with a Host, and with where it
    came from. A chunked body is sent chunked with no Content-Length beside it: a request that
    carried both is never passed on two ways to read it (request smuggling)."""
    headers: list[tuple[bytes, bytes]] = []
    forwarded_for = peer.encode()
    # The headers that say how to read the request are never the client's hop's to drop.
    named = {
        token.strip().lower()
        for key, value in request.headers
        if key == b"connection"
        for token in value.split(b",")
    } - _FRAMING
    chunked = any(key == b"transfer-encoding" for key, _ in request.headers)
    target, authority = _origin_form(request.target)
    host = authority
    for key, value in request.headers:
        if key in HOP_BY_HOP or key in named or key in _OURS:
            continue
        if key == b"content-length" and chunked:
            continue
        if key == b"host":
            host = host or value  # the absolute form's authority wins (RFC 9112 3.2.2)
            continue
        if key == b"x-forwarded-for":
            forwarded_for = value + b", " + forwarded_for
            continue
        if key == b"cookie":
            value = _without_console_session(value)
            if not value:
                continue
        headers.append((key, value))
    headers.insert(0, (b"host", host or address.encode()))  # HTTP/1.0 clients may send none
    if chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    headers.append((b"x-forwarded-for", forwarded_for))
    headers.append((b"x-forwarded-proto", b"http"))
    headers.append((b"x-forwarded-prefix", route.encode()))
    return h11.Request(method=request.method, target=target, headers=headers)


_FRAMING = frozenset({b"host", b"content-length", b"transfer-encoding"})
#: The daemon's console session cookies (``controller_session_PORT``): a browser sends them to
#: every port of the host, this one included, and they are nothing a replica should see.
_CONSOLE_COOKIE = re.compile(rb"\s*controller_session(?:_[0-9]+)?=")


def _without_console_session(cookies: bytes) -> bytes:
    return b"; ".join(c.strip() for c in cookies.split(b";") if not _CONSOLE_COOKIE.match(c))


#: Set by the ingress alone: a client's own are dropped.
_OURS = frozenset({b"x-forwarded-proto", b"x-forwarded-prefix"})


def _origin_form(target: bytes) -> tuple[bytes, bytes]:
    """The target as a path (and query), and the authority if it came in absolute form."""
    if target.startswith((b"http://", b"https://")):
        rest = target.partition(b"//")[2]
        authority, slash, path = rest.partition(b"/")
        query = b""
        if b"?" in authority:  # http://host?q
            authority, _, query = authority.partition(b"?")
            return b"/?" + query, authority
        return slash + path if slash else b"/", authority
    return target, b""


def _path_of(target: bytes) -> str:
    path = _origin_form(target)[0].partition(b"?")[0].partition(b"#")[0]
    return path.decode("latin-1") or "/"


def _peer(stream: trio.SocketStream) -> str:
    try:
        host = stream.socket.getpeername()[0]
    except OSError:
        return "-"
    return str(host)
