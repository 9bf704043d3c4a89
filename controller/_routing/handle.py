"""Calls from code to a backend by name: a handle (``controller.worker.handle("embed")`` inside a
replica, ``ctl.handle("embed")`` beside an embedded controller).

A handle chooses the replica as the ingress does, from the same router (power of two choices,
``max_ongoing_requests``, the backend's queue up to ``max_queued_requests``, a canary's split,
replicas at its own host first), and speaks the ingress's HTTP/1.1 to it on pooled connections.
On the wire everything is HTTP and JSON, never pickle: ``request`` sends what it is given,
``call`` sends a method's arguments as a JSON object (``x-controller-call: NAME``), which the
replica's server answers with the method's JSON result.

A call is part of the request that makes it. It runs in the caller's task, so it is cancelled
with it (a deadline, a client's hang-up, a cancelled caller): its connection then closes, which
the callee's server sees as a hang-up and cancels its handler too, hop after hop, and every
place taken on the way is given back in a ``finally``. Its deadline is what the caller's request
has left (`current_deadline`, set by the replica's server around each handler), capped by the
callee's own ``request_timeout_s``; the callee hears it as ``x-request-timeout-ms``."""

from __future__ import annotations

import contextvars
import json as jsonlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, final

import attrs
import trio

from .._http.answers import ResponseHead, ResponseReader
from .._http.errors import Reply
from .exchange import (
    CALL_HEADER,
    HTTP_TOKEN,
    HandleError,
    Items,
    Pieces,
    answer_head,
    call_body,
    extra_headers,
    raise_remote,
    send_request,
    until,
)
from .models import HELD_HEADER, MODEL_HEADER, model_id_problem, requested_model, take_header
from .policy import session_key
from .router import Router
from .split import SIDE_HEADER, Side, callee_side, choose_side, current_side
from .table import BackendRoutes, Rejected, Slot
from .upstream import NotSent, Pool, Stale, Upstream

#: The trio time by which the request a handler serves must be answered: set by a replica's
#: server around each handler; a handle's call inherits it (None: no request, no deadline).
current_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "controller_request_deadline", default=None
)

#: How long after its request's deadline a call made outside that request's scope gives up.
BACKSTOP_S = 1.0
_REPEATABLE = frozenset({b"GET", b"HEAD", b"OPTIONS"})


@final
@attrs.frozen
class HandleAnswer:
    """What a callee answered a ``request``."""

    status: int
    headers: Sequence[tuple[bytes, bytes]]
    """As sent (names in lower case)."""
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header `name`, in any case, or None."""
        key = name.lower().encode("latin-1")
        for found, value in self.headers:
            if found == key:
                return value.decode("latin-1")
        return None

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return jsonlib.loads(self.body)


@final
class Handle:
    """Calls backend `name`. Made by the process's handles (``controller.worker.handle``)."""

    def __init__(
        self,
        name: str,
        router: Router,
        pool: Pool,
        ready: Callable[[], Awaitable[None]],
        key: bytes | None = None,
        model: str | None = None,
    ):
        self.name = name
        self._router = router
        self._pool = pool
        self._ready = ready
        self._key = key
        self._model = model

    def __repr__(self) -> str:
        return f"<Handle {self.name}>"

    def options(
        self, *, session_key: str | bytes | None = None, model_id: str | None = None
    ) -> Handle:
        """This handle with other options: `session_key` keeps its calls on one replica under
        the backend's ``affinity`` policy (as its header or cookie does for a request; without
        a policy, it is not used); `model_id` names the model its calls are for (as the
        ``x-model-id`` header does): they go to a replica that holds it."""
        if session_key is not None and not isinstance(session_key, (str, bytes)):
            raise TypeError(
                f"handle.options: session_key must be str or bytes, not {session_key!r}"
            )
        if model_id is not None:
            problem = model_id_problem(model_id)
            if problem is not None:
                raise ValueError(f"handle.options: model_id {problem}")
        key = session_key.encode() if isinstance(session_key, str) else session_key
        key = key or self._key
        model = model_id if model_id is not None else self._model
        return Handle(self.name, self._router, self._pool, self._ready, key, model)

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        """``await handle.predict(x)`` is ``await handle.call("predict", x)``."""
        if method.startswith("_"):
            raise AttributeError(method)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self.call(method, *args, **kwargs)

        return call

    # -- calls --

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` of a replica of a class backend; its result. The
        arguments and the result are JSON. ``RemoteError`` if the method raised; another
        ``HandleError`` if no replica answered."""
        answer = await self.request(
            "POST", "/", body=call_body(method, args, kwargs), headers={CALL_HEADER: method}
        )
        if answer.status == 200:
            if answer.header("content-type") == "application/x-ndjson":
                raise TypeError(
                    f"handle.call({method!r}): it is a generator method; call it with call_stream"
                )
            return answer.json()
        raise_remote(self.name, answer.status, answer.body)

    @asynccontextmanager
    async def call_stream(
        self, method: str, *args: Any, **kwargs: Any
    ) -> AsyncIterator[AsyncIterator[Any]]:
        """``async with handle.call_stream("generate", prompt) as items: async for item in
        items``: a generator method's items, as the callee yields them. Leaving the block early
        ends the call (the callee's generator is cancelled)."""
        body = call_body(method, args, kwargs)
        async with self._opened("POST", "/", body, None, {CALL_HEADER: method}) as (head, piece):
            if head.status != 200:
                raise_remote(self.name, head.status, b"".join([p async for p in piece]))
            yield Items(piece, self.name)

    async def request(
        self,
        method: str,
        path: str = "/",
        *,
        body: bytes | None = None,
        json: Any = None,
        headers: Mapping[str | bytes, str | bytes] | None = None,
    ) -> HandleAnswer:
        """An HTTP request to a replica of the backend (`path` as its code sees it, without
        the backend's route prefix); its whole answer, whatever its status."""
        async with self._opened(method, path, body, json, headers) as (head, pieces):
            parts = [piece async for piece in pieces]
        return HandleAnswer(head.status, tuple(head.headers), b"".join(parts))

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str = "/",
        *,
        body: bytes | None = None,
        json: Any = None,
        headers: Mapping[str | bytes, str | bytes] | None = None,
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """``async with handle.stream("GET", "/tokens") as pieces: async for piece in
        pieces``: an answer's body as it arrives (tokens, server-sent events). ``HandleError``
        unless its status is 2xx. Leaving the block early ends the request."""
        async with self._opened(method, path, body, json, headers) as (head, pieces):
            if not 200 <= head.status < 300:
                raise HandleError(self.name, "Status", f"answered {head.status}")
            yield pieces

    # -- the exchange --

    @asynccontextmanager
    async def _opened(
        self,
        method: str,
        path: str,
        body: bytes | None,
        json: Any,
        headers: Mapping[str | bytes, str | bytes] | None,
    ) -> AsyncIterator[tuple[ResponseHead, Pieces]]:
        """One request, sent and answered as far as its head; its body's pieces follow. The
        replica's place is given back, and its connection pooled (or closed), on the way out,
        whatever happens."""
        if json is not None:
            if body is not None:
                raise ValueError("handle.request: give body or json, not both")
            body = jsonlib.dumps(json, separators=(",", ":")).encode()
            headers = {"content-type": "application/json", **(headers or {})}
        given: object = body
        if given is not None and not isinstance(given, bytes):
            raise TypeError(f"handle.request: body must be bytes, not {type(given).__name__}")
        verb = method.upper().encode("ascii")
        if not HTTP_TOKEN.fullmatch(verb):
            raise ValueError(f"handle.request: method {method!r} is not an HTTP token")
        if not path.startswith("/") or any(c in path for c in "\r\n #"):
            raise ValueError(f"handle.request: path {path!r} must be an origin-form path")
        extra = extra_headers(headers)
        if self._model is not None:
            extra = [
                *(h for h in extra if h[0] != MODEL_HEADER),
                (MODEL_HEADER, self._model.encode()),
            ]
        try:
            model = requested_model(extra)
        except Reply as reply:
            raise ValueError(f"handle.request: {reply}") from None
        call = any(key == CALL_HEADER for key, _ in extra)
        backend = await self._backend()
        deadline, give_up = _deadline(backend)
        repeatable = verb in _REPEATABLE and not body
        key = self._key if self._key is not None else session_key(backend.affinity, extra)
        side = _side(backend, extra)
        if model is not None:
            backend.asked(model)
        tried: frozenset[str] = frozenset()
        retrying = False  # counted in the backend's retry budget until the call ends
        try:
            while True:
                slot = await self._acquire(backend, tried, give_up, key, side, model)
                upstream: Upstream | None = None
                answered = False
                try:
                    with until(give_up, self.name):
                        upstream = await self._pool.get(slot.address, check=not repeatable)
                        left_ms = max(1, int((deadline - trio.current_time()) * 1000))
                        # The side the call reached, which the callee's own calls keep to.
                        reached = backend.side_of(slot)
                        sent = (
                            extra if reached is None else [*extra, (SIDE_HEADER, reached.encode())]
                        )
                        await send_request(
                            upstream, verb, path, sent, body, left_ms, backend.max_ongoing
                        )
                        reader = ResponseReader()
                        reader.head_only = verb == b"HEAD"
                        head = await answer_head(upstream, reader, repeatable, self.name)
                    answered = True
                    held = take_header(head.headers, HELD_HEADER)
                    if held is not None:
                        backend.heard(slot, held)
                except Stale:
                    self._pool.forget(slot.address)
                    repeatable = False  # once more, on a new connection
                except NotSent as exc:
                    backend.refused(slot)
                    self._pool.forget(slot.address)
                    tried = tried | {slot.tag}
                    why = backend.retry(len(tried), retrying)
                    if why is not None:
                        raise HandleError(self.name, "Unreachable", f"{exc}; {why}") from None
                    retrying = True
                finally:
                    if not answered:  # tried again, or failed: its place and connection go
                        backend.release(slot)
                        if upstream is not None:
                            self._pool.put(upstream)
                if answered:
                    break
            assert upstream is not None
            pieces = Pieces(upstream, reader, give_up, self.name, deadline)
            try:
                yield head, pieces
                # Reused only if the answer was read to its end and nothing was left over;
                # after a body, only for a call (which the replica's own server reads whole
                # first).
                upstream.reusable = (
                    head.keep_alive and pieces.done and not reader.extra and (not body or call)
                )
            finally:
                backend.release(slot)
                self._pool.put(upstream)
        finally:
            if retrying:
                backend.retry_done()

    async def _backend(self) -> BackendRoutes:
        await self._ready()
        backend = self._router.backends.get(self.name)
        if backend is None:
            if not self._router.connected:
                where = self._router.source.describe()
                message = f"{where} cannot be reached, and nothing is known of the backend yet"
                raise HandleError(self.name, "NoRoutes", message)
            raise HandleError(self.name, "UnknownBackend", "there is no such backend")
        return backend

    async def _acquire(
        self,
        backend: BackendRoutes,
        tried: frozenset[str],
        deadline: float,
        key: bytes | None,
        side: Side | None,
        model: str | None,
    ) -> Slot:
        slot = backend.try_acquire(tried, side, key, model)
        if slot is not None:
            return slot
        try:
            with until(deadline, self.name):
                return await backend.wait(tried, key, model)
        except Rejected as exc:
            kind = "Overloaded" if exc.cause == "queue_full" else "NoReplicas"
            said = str(exc).removeprefix(f"backend {self.name!r} ")  # HandleError names it
            raise HandleError(self.name, kind, said) from None


def _side(backend: BackendRoutes, headers: Sequence[tuple[bytes, bytes]]) -> Side | None:
    """The side of the callee a call goes to: its caller's request's (so that a request on a
    canary calls canaries, and one on a rolling update's new replicas calls new ones where the
    callee rolls too), else one drawn by the callee's split as the ingress draws (None: no
    split, and no side to keep to)."""
    split = backend.split
    kept = callee_side(current_side.get(), split)
    if kept is not None or split is None:
        return kept
    return choose_side(split, headers, backend.rng)


def _deadline(backend: BackendRoutes) -> tuple[float, float]:
    """What the caller's request has left, capped by the callee's own request_timeout_s; and
    when the call itself gives up (``DeadlineExceeded``). At the callee's own timeout, that is
    the deadline. At the caller's request's, the request's server cancels the handler (and so
    the call) then, which answers 504 as a handler past its deadline does: a call that gave up
    first would turn it into the handler's error, a 500. So it gives up only `BACKSTOP_S`
    later, for a call made outside its request's scope (a task the handler left running)."""
    own = trio.current_time() + backend.request_timeout_s
    inherited = current_deadline.get()
    if inherited is None or own <= inherited:
        return own, own
    return inherited, inherited + BACKSTOP_S
