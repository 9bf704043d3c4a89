"""A replica's own HTTP server: the worker serves the backend's code (a function, a callable
class, an ASGI application) on the port the runtime reserved for the replica, over the same
HTTP/1.1 as the ingress (``_http``: one parser, one set of framing and smuggling rules).

Each request is served by its connection's task, under that connection's one cancel scope: a
client that hangs up (the ingress, whose own client did), or the request's deadline, cancels
the handler where it waits, and every count taken for it is given back in the ``finally`` that
encloses it. The deadline is what the caller says the request has left (``x-request-timeout-ms``,
in milliseconds: the ingress sends its backend's ``request_timeout_s`` as it is now, less the
time the request has taken), else the backend's at the replica's start; past it the client
gets 504. At most ``max_ongoing_requests`` handlers run at once, however many ingresses send:
more wait here, first come first served; the ingress says the backend's limit as it is now with
each request (``x-max-ongoing-requests``), so that a change reaches the replica with no
restart. Both are the request's own: nothing a request says changes what another gets
(``places``). An upload (a body the ingress streams on, marked ``x-controller-upload``) takes
its place once its body has all arrived: a slow body takes no one's place, and what its handler
does with it is within the limit.
What waits and what runs is the replica's load, which the worker reports as a replica's own
``load()``."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, final

import trio

from .._http.answers import error_body, own_answer
from .._http.connection import Connection
from .._http.errors import ClientGone, Reply
from .._http.framing import Problem, RequestHead
from .._http.limits import ConnectionLimits
from .._http.server import Server, open_listener
from .._model.config.traffic import MAX_REQUESTS
from .._model.records.code_report import CodeReport
from .._ports.hosting import tracebacks
from .._routing.exchange import CALL_HEADER
from .._routing.handle import current_deadline
from .._routing.models import MODEL_HEADER, MODEL_ID_RULE, model_of, shown_value
from .._routing.split import SIDE_HEADER, Side, current_side, side_of_header
from .._routing.upstream import UPLOAD_HEADER
from . import rpc
from .asgi import AppError, Exchange, Lifespan, http_scope
from .calls import Caller
from .entry import Entry
from .multiplex import Shelf, current_model, current_shelf
from .outgoing import Outgoing
from .places import Places
from .request import Address, BodyTooLarge, Request
from .response import Answer, answer_of, item_bytes

logger = logging.getLogger("controller.worker")

#: The time the caller has left for the request, in milliseconds: the ingress sends it, from its
#: backend's request_timeout_s as it is now (and the time the request has taken so far).
TIMEOUT_HEADER = b"x-request-timeout-ms"
#: The backend's max_ongoing_requests as it is now: the ingress sends it, so that a change of it
#: reaches the replica with the next request (no restart).
MAX_ONGOING_HEADER = b"x-max-ongoing-requests"
#: The route prefix the request came in under (the ingress sends it): Starlette's root path.
PREFIX_HEADER = b"x-forwarded-prefix"
#: A drain waits until no request has been in flight for this long (routers stop sending
#: first, but a request chosen just before may still be on its way).
QUIET_S = 0.2
#: How often, at most, the replica's load is reported (as a ``load()`` method's is read).
REPORT_S = 0.1
#: How often, at most, the count of requests served is reported when the load stays the same.
SERVED_REPORT_S = 1.0
#: Its clients are ingresses and handles, which hold many connections from one address.
SERVER_LIMITS = ConnectionLimits(max_connections_per_client=10_000)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_JSON = b"application/json"


@final
class ReplicaServer:
    """Serves `entry` (any kind but a class that serves itself) until drained or cancelled."""

    def __init__(
        self,
        entry: Entry,
        *,
        max_ongoing_requests: int = 100,
        request_timeout_s: float = 60.0,
        limits: ConnectionLimits = SERVER_LIMITS,
        shelf: Shelf | None = None,
    ):
        assert entry.served
        self.entry = entry
        self.max_ongoing_requests = max_ongoing_requests
        self.request_timeout_s = request_timeout_s
        self.in_flight = 0
        """Requests whose handler runs now."""
        self.served = 0
        """Requests ended, however they ended."""
        self.failed = 0
        """Requests whose handler raised (answered 500, or cut short)."""
        self._places = Places()
        self.shelf = Shelf() if shelf is None else shelf
        """Its models, if its code is multiplexed: a worker's and a Ray actor's is the
        process's (``process_shelf``), which a loader called outside a request fills too."""
        self.shelf.on_change = self._changed
        self._caller = None if entry.kind == "asgi" else Caller(entry.target, self._changed)
        self._lifespan = Lifespan(entry.target) if entry.kind == "asgi" else None
        self._limits = limits
        self._server = Server(limits, self, logger, "replica")
        self._wake: trio.Event | None = None
        self._clock: Callable[[], float] | None = None
        self._address: tuple[str, int] = ("127.0.0.1", 0)
        self._finished = trio.Event()
        self.up = False
        """It listens and its application has started: what fails now fails a live server."""

    @property
    def waiting(self) -> int:
        """Requests waiting for one of the `max_ongoing_requests` places."""
        return self._places.waiting

    @property
    def load(self) -> int:
        """Requests it holds: running and waiting; and sync calls still running whose
        requests were let go of (a deadline, a hang-up): each holds a thread as a request
        would."""
        stuck = 0 if self._caller is None else self._caller.threads.stuck
        return self.in_flight + self.waiting + stuck

    def problem(self) -> str | None:
        """Why it cannot serve, if it cannot (its health check fails, so that it is replaced):
        every thread its sync handler may have is held by a call whose request ended, cut at
        its deadline or abandoned by its client, and still running."""
        if self._caller is None or not self._caller.threads.wedged:
            return None
        threads = self._caller.threads
        return (
            f"its handler's {threads.limit} threads are all held by calls whose requests "
            "ended (at their deadline, or their client left) and that have not returned: no "
            "request can be served"
        )

    async def follow_load(
        self, said: Callable[[int, int, CodeReport | None], Awaitable[None]]
    ) -> None:
        """Hand `said` each new figure of `load` (with the requests `served`, and a
        multiplexed replica's models), at most every `REPORT_S` (a burst of requests is one
        report), until cancelled: the replica's own load, reported as a ``load()`` method's
        would be. When only the count of requests served moves, it is said at most every
        `SERVED_REPORT_S`."""
        load = served = generation = -1
        said_at = -math.inf
        while True:
            changed = self.next_change()  # before `said`, which may wait
            now = trio.current_time()
            due = said_at + SERVED_REPORT_S
            moved = self.load != load or self.shelf.generation != generation
            if moved or (self.served != served and now >= due):
                load, served, said_at = self.load, self.served, now
                generation = self.shelf.generation
                await said(load, served, self.shelf.report())
            elif self.served != served:
                with trio.move_on_after(due - now):  # said then, or at a change of the load
                    await changed.wait()
                continue
            await changed.wait()
            await trio.sleep(REPORT_S)

    def next_change(self) -> trio.Event:
        """Set at the next change of `load` (or of the requests served)."""
        if self._wake is None:
            self._wake = trio.Event()
        return self._wake

    def _changed(self) -> None:
        wake = self._wake
        if wake is not None:
            self._wake = None
            wake.set()

    async def run(
        self, host: str, port: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on `host`:`port` (refused at once if it is taken), start the application's
        lifespan, and serve; ``task_status.started()`` once it takes connections. Returns once
        drained."""
        listener = await open_listener(host, port)
        self._address = (host, int(listener.socket.getsockname()[1]))
        self._clock = trio.lowlevel.current_clock().current_time
        try:
            async with trio.open_nursery() as nursery:
                if self._lifespan is not None:
                    await self._lifespan.startup(nursery)
                self.up = True
                await self._server.serve([listener], task_status=task_status)
                if self._lifespan is not None:
                    await self._lifespan.shutdown()
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # One failure (its application's startup, say) is said as itself, not as a group.
            if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
                raise group.exceptions[0] from None
            raise
        finally:
            if not self.up:
                listener.socket.close()  # its application never started: nothing served it
            self._finished.set()

    @property
    def port(self) -> int:
        return self._address[1]

    async def drain(self) -> None:
        """Wait for a quiet moment (nothing in flight, and nothing new for `QUIET_S`), then
        stop: the listener closes (a late client is refused, and its router tries another
        replica), and the application's lifespan shuts down. Bound it with a deadline."""
        while True:
            if self.load:
                await self.next_change().wait()
                continue
            with trio.move_on_after(QUIET_S) as window:
                await self.next_change().wait()
            if window.cancelled_caught and not self.load:
                break
        self.close()
        await self._finished.wait()

    def close(self) -> None:
        """Stop taking connections now (``drain`` waits for a quiet moment first): the
        listener closes, idle connections close, busy ones after their request."""
        self._server.close()

    # -- one request (the connection's handler) --

    async def exchange(self, conn: Connection, head: RequestHead) -> bool:
        # What its router says of it now (else the replica's at its start): this request's own.
        budget, root_path, limit = self.request_timeout_s, "", self.max_ongoing_requests
        call: str | None = None
        side: Side | None = None
        model: str | None = None
        upload = False
        for name, value in head.headers:
            if name == TIMEOUT_HEADER:
                budget = _milliseconds(value, budget) / 1000
            elif name == PREFIX_HEADER:
                root_path = value.decode("latin-1")
            elif name == MAX_ONGOING_HEADER:
                limit = _limit(value, limit)
            elif name == CALL_HEADER:
                call = value.decode("latin-1")
            elif name == SIDE_HEADER:
                side = side_of_header(value)
            elif name == UPLOAD_HEADER:
                upload = True
            elif name == MODEL_HEADER and model is None:  # the first, as routers read it
                model = model_of(value.strip(b" \t"))
                if model is None:
                    return await self._bad_model(conn, head, value)
        deadline = trio.current_time() + budget
        conn.request_deadline = deadline
        conn.timer.set(deadline, "deadline")
        self._changed()  # read a moment later, when it may wait in line
        placed = False

        async def take_place() -> None:
            nonlocal placed
            try:
                await self._places.take(limit)  # in line, first come first served
            except BaseException:
                self._changed()  # it left the line unserved (a deadline, a hang-up)
                raise
            placed = True

        # An upload's body arrives at the client's pace: its handler runs meanwhile beside the
        # places, and takes one once the body has all come (``_reader``), before what it does
        # with it. Bounded meanwhile by the ingress's upload budget.
        if not upload:
            await take_place()
        self.in_flight += 1
        # What handles called by the handler inherit: the time this request has left, and the
        # side of a canary's split it went to.
        inherited = current_deadline.set(deadline)
        inherited_side = current_side.set(side)
        inherited_model = current_model.set(model)
        inherited_shelf = current_shelf.set(self.shelf)
        if model is not None:
            self.shelf.asked(model)
        try:
            late = take_place if upload else None
            if self._lifespan is not None and call is None:
                return await self._asgi(conn, head, root_path, late)
            return await self._plain(conn, head, root_path, deadline, limit, call, late)
        finally:
            current_shelf.reset(inherited_shelf)
            current_model.reset(inherited_model)
            current_side.reset(inherited_side)
            current_deadline.reset(inherited)
            self.in_flight -= 1
            self.served += 1
            if placed:
                self._places.give_back()
            self._changed()

    def _reader(
        self,
        conn: Connection,
        head: RequestHead,
        done: list[bool],
        at_end: Callable[[], Awaitable[None]] | None = None,
    ) -> Any:
        """How a handler reads the body of `head` (None without one); `done` is set at its
        end, once `at_end` (an upload's place taken) is over."""
        if not head.body:
            done.append(True)
            return None
        asked = False

        async def read() -> bytes | None:
            nonlocal asked
            if not asked:
                asked = True
                if head.expect_continue and conn.answered is None:
                    await conn.send(_CONTINUE)
            chunk = await conn.body()
            if chunk is None and not done:
                if at_end is not None:
                    await at_end()
                done.append(True)
            return chunk

        return read

    async def _plain(
        self,
        conn: Connection,
        head: RequestHead,
        root_path: str,
        deadline: float,
        limit: int,
        call: str | None,
        late: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """A request to the handler, or (`call`) to a method a handle named (``rpc``); an
        upload's place taken `late` (``exchange``)."""
        caller = self._caller
        if caller is None:  # an ASGI app: it has no methods to call
            caller = self._caller = Caller(_no_handler, self._changed)
        done: list[bool] = []
        request = Request(
            head.method.decode("latin-1"),
            head.target,
            head.headers,
            Address(conn.peer, 0),
            self._reader(conn, head, done, late),
            root_path=root_path,
            deadline=deadline,
            clock=self._clock,
        )
        outgoing = Outgoing(conn, head, self.shelf)
        try:
            if call is not None:
                body = await request.body()
                instance = self.entry.instance
                failed = partial(self._failed, head)
                answer = await rpc.answer(caller, instance, call, body, limit, failed)
            else:
                if caller.in_thread and head.body:
                    await request.body()  # a sync handler is called with its body read
                answer = answer_of(await caller(request, limit))
        except ClientGone:
            raise
        except Reply as reply:  # its body could not be read: said, and the connection ends
            body = error_body(reply.kind, str(reply))
            await outgoing.whole(reply.status, [(b"content-type", _JSON)], body, keep=False)
            return False
        except BodyTooLarge as exc:
            answer = Answer(413, [(b"content-type", _JSON)], error_body("BodyTooLarge", str(exc)))
        except Exception as exc:
            self._failed(head, exc)
            answer = _FAILED if call is None else rpc.failure(exc)
        if answer.stream is None:
            body_done = bool(done) or conn.skip_body()
            await outgoing.whole(answer.status, answer.headers, answer.body, keep=body_done)
            return outgoing.keep
        await outgoing.begin(answer.status, answer.headers, keep=bool(done), http_10=head.http_10)
        try:
            async with contextlib.aclosing(caller.items(answer.stream)) as items:
                async for item in items:
                    await outgoing.part(item_bytes(item))
        except ClientGone:
            raise
        except Exception as exc:
            self._failed(head, exc)
            raise ClientGone from None  # cut short: the client sees an answer that never ended
        await outgoing.end()
        return outgoing.keep

    async def _asgi(
        self,
        conn: Connection,
        head: RequestHead,
        root_path: str,
        late: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        assert self._lifespan is not None
        done: list[bool] = []
        outgoing = Outgoing(conn, head, self.shelf)
        scope = http_scope(head, conn.peer, self._address, root_path, self._lifespan.state)
        exchange = Exchange(head, outgoing, self._reader(conn, head, done, late), scope)
        try:
            await self._lifespan.app(scope, exchange.receive, exchange.send)
            if not outgoing.started:
                raise AppError("the application returned without starting its response")
            if not outgoing.done:
                raise AppError("the application returned before its response's body ended")
        except ClientGone:
            raise
        except Reply as reply:  # its body could not be read: said, if it still can be
            if outgoing.started:
                raise ClientGone from None
            body = error_body(reply.kind, str(reply))
            await outgoing.whole(reply.status, [(b"content-type", _JSON)], body, keep=False)
            return False
        except Exception as exc:
            self._failed(head, exc)
            if outgoing.started:
                raise ClientGone from None
            await outgoing.whole(_FAILED.status, _FAILED.headers, _FAILED.body, keep=False)
        return outgoing.keep

    async def _bad_model(self, conn: Connection, head: RequestHead, value: bytes) -> bool:
        message = f"x-model-id: must be {MODEL_ID_RULE} (got {shown_value(value)})"
        body = error_body("BadModelId", message)
        outgoing = Outgoing(conn, head)
        await outgoing.whole(400, [(b"content-type", _JSON)], body, keep=conn.skip_body())
        return outgoing.keep

    def _failed(self, head: RequestHead, exc: BaseException) -> None:
        """The handler raised: its traceback to the replica's log (not to the client)."""
        self.failed += 1
        whole, _ = tracebacks(exc)
        target = head.target.decode("latin-1")[:200]
        sys.stderr.write(f"{head.method.decode('latin-1')} {target} failed:\n{whole}")

    # -- what the connection asks besides --

    async def refuse(self, conn: Connection, problem: Problem) -> None:
        body = error_body(problem.kind, str(problem))
        with contextlib.suppress(ClientGone):
            await conn.send(own_answer(problem.status, _JSON, body, close=True))

    async def expired(self, conn: Connection, phase: str) -> None:
        said = _EXPIRED.get(phase)
        if said is None or conn.answered is not None:
            return  # idle (closed without a word), or an answer under way (cut short)
        status, kind, message = said
        if phase == "deadline":
            # Not a figure: the request's own (its backend's request_timeout_s as its router
            # knows it now, or less that its caller had left) is not this replica's at its start.
            message += " (its backend's request_timeout_s, or what its caller had left)"
        answer = own_answer(status, _JSON, error_body(kind, message), close=True)
        with trio.move_on_after(self._limits.body_timeout_s), contextlib.suppress(ClientGone):
            await conn.send(answer)


def _no_handler(request: Any) -> None:
    """The handler of an ASGI app's caller, which only calls methods (and finds none)."""


def _limit(value: bytes, otherwise: int) -> int:
    """A limit header's count, if it is one in range."""
    try:
        limit = int(value)
    except ValueError:
        return otherwise
    return limit if 1 <= limit <= MAX_REQUESTS else otherwise


def _milliseconds(value: bytes, budget_s: float) -> float:
    """A timeout header's milliseconds (at least 0); one that is not a number says nothing,
    and the budget stands."""
    try:
        ms = float(value)
    except ValueError:
        return budget_s * 1000
    if not ms >= 0:  # negative, or NaN
        return 0.0
    return ms


_FAILED = Answer(
    500,
    [(b"content-type", _JSON)],
    error_body("HandlerError", "the handler failed; the replica's log has the traceback"),
)
_EXPIRED: dict[str, tuple[int, str, str]] = {
    "head": (408, "RequestTimeout", "the request head did not arrive in time"),
    "body": (408, "RequestTimeout", "the request body stalled"),
    "deadline": (504, "GatewayTimeout", "the handler did not answer within its deadline"),
}


def serving_line(spec: dict[str, Any], entry: Entry) -> str:
    """What a replica's log says once its server listens."""
    kinds = {
        "function": "a function",
        "callable": "a callable class",
        "asgi": "an ASGI app",
        "methods": "a class of methods",
    }
    return (
        f"{spec['tag']}: serving HTTP on {spec['host']}:{spec['port']} "
        f"({spec['entrypoint']}, {kinds.get(entry.kind, entry.kind)})"
    )
