"""The daemon's HTTP API, as an ASGI application (served by hypercorn on trio).

JSON in and out; every path but ``/healthz`` needs ``Authorization: Bearer <token>``. A rejected
request changes nothing: bodies are read in full, size-checked, parsed and validated before any
call into the controller. ``OPENAPI`` documents it all and is served at ``/openapi.json``.

Here: a request's way in (the token or the console's session, a standby's redirect to the
leader, its route) and its answer out. What each path does is in ``handlers``.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import final
from urllib.parse import parse_qs, unquote

from .._core.controller import Controller
from .._model.values.errors import ControllerError
from .._ports.runtime import LogSource
from .console import Console, same_origin
from .errors import domain_error
from .handlers import Answer, Call, Handlers, IngressView
from .http import (
    HTTPError,
    Receive,
    Scope,
    Send,
    check_method,
    dump,
    lifespan,
    path_of,
    read_body,
    route_token,
)
from .routes import find_route
from .serving import Serving
from .timeline import Timelines

logger = logging.getLogger("controller.api")


@final
class Api:
    """The ASGI app. `render_metrics` gives the Prometheus text; `ingress`, the daemon's
    ingress processes (``GET /api/v1/ingress``, and their metrics). ``POST /api/v1/shutdown``
    writes the delete of every backend (in one store batch), then calls `request_shutdown`,
    which the daemon answers once the drains are done (or given up on) with the backends left,
    and then exits; from the write on, changes are refused. With ``?wait=false`` the request
    returns at once (202), and the rest goes on."""

    def __init__(
        self,
        controller: Controller | None,
        *,
        token: str,
        epoch: str = "",
        render_metrics: Callable[[], bytes],
        request_shutdown: Callable[[], None],
        shutdown_done: Callable[[], Awaitable[list[str]]] | None = None,
        logs: LogSource | None = None,
        serving: Serving | None = None,
        console: Console | None = None,
        timelines: Timelines | None = None,
        ingress: IngressView | None = None,
    ):
        # A daemon with standbys serves what `serving` holds now (its controller while it
        # leads, its view of the store while it stands by); else the one controller given.
        self._serving = serving if serving is not None else Serving.fixed(controller, epoch)
        self._token = token.encode()
        self._route_token = route_token(token).encode()
        self._console = console if console is not None else Console(token)
        self.throttle = self._console.throttle
        """Wrong tokens, slowed and counted per client address: its `run` logs their summary."""
        self._handlers = Handlers(
            self._serving,
            render_metrics=render_metrics,
            request_shutdown=request_shutdown,
            shutdown_done=shutdown_done,
            logs=logs,
            console=self._console,
            timelines=timelines if timelines is not None else Timelines(),
            ingress=ingress,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if self._console.owns(path_of(scope)):
            await self._console(scope, receive, send)
            return
        retry_after: int | None = None
        allow: tuple[str, ...] = ()
        location: str | None = None
        try:
            try:
                status, body, content_type = await self._route(scope, receive)
            except ControllerError as exc:
                raise domain_error(exc) from exc
        except HTTPError as exc:
            status, body, content_type = exc.status, dump(exc.body), "application/json"
            retry_after, allow, location = exc.retry_after, exc.allow, exc.location
            if exc.body["error"]["type"] == "NoLeader":
                # A takeover under way: a moment's answer, not a fault of this daemon.
                logger.info("API: %s %s: %s", scope["method"], scope["path"], exc)
            elif status >= 500:
                logger.error("API: %s %s: %s", scope["method"], scope["path"], exc)
        except Exception:
            logger.exception("API error on %s %s", scope["method"], scope["path"])
            status = 500
            body = dump({"error": {"type": "InternalError", "message": "see the daemon's log"}})
            content_type = "application/json"
        headers = [
            (b"content-type", content_type.encode()),
            (b"content-length", b"%d" % len(body)),
            (b"x-content-type-options", b"nosniff"),
        ]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="controller"'))
        if retry_after is not None:
            headers.append((b"retry-after", b"%d" % retry_after))
        if allow:
            headers.append((b"allow", ", ".join(allow).encode()))
        if location is not None:
            headers.append((b"location", location.encode()))
        head = scope["method"] == "HEAD"
        await send({"type": "http.response.start", "status": status, "headers": headers})
        # HEAD: the headers a GET would get (its length too), and no body.
        await send({"type": "http.response.body", "body": b"" if head else body})

    def _check_leading(self, scope: Scope) -> None:
        """Changes go to the leader: a standby sends the client there (307, same method and
        body), or says that no daemon leads just now (503)."""
        if self._serving.leading:
            return
        leader = self._serving.leader_url()
        if leader is None:
            raise HTTPError(
                503,
                "NoLeader",
                "no daemon leads just now: this one does not hold the lease (a takeover is "
                "under way, or its store cannot be written: its log says which); nothing was "
                "changed, try again",
                retry_after=1,
            )
        query = scope.get("query_string", b"").decode()
        target = scope.get("raw_path", b"").decode() or path_of(scope)
        location = leader.rstrip("/") + target + (f"?{query}" if query else "")
        raise HTTPError(
            307,
            "NotLeader",
            f"this daemon is a standby; changes go to the leader at {leader}",
            location=location,
            leader=leader,
        )

    async def _route(self, scope: Scope, receive: Receive) -> Answer:
        method: str = scope["method"]
        path = path_of(scope)
        route, raw_args = find_route(path)
        # Matched as sent, each part then read as the name it encodes ("a%20b" is "a b"), so
        # that an error names what the client meant.
        args = tuple(unquote(arg) for arg in raw_args)
        # Every path but the public ones needs the token (or the console's session), even to
        # learn that it does not exist.
        by_session = (
            False
            if route is not None and route.public
            else await self._authenticate(scope, route is not None and route.for_routers)
        )
        if route is None:
            raise HTTPError(404, "NotFound", f"no such endpoint: {path}")
        check_method(method, route.methods, path)
        if method not in ("GET", "HEAD") and not route.anywhere:
            self._check_leading(scope)
        head = method == "HEAD"
        # Only the requests that carry a body read one: the others ignore what is sent.
        body = await read_body(scope, receive) if method in route.bodies else b""
        query = parse_qs(scope.get("query_string", b"").decode(), keep_blank_values=True)
        call = Call(scope, receive, "GET" if head else method, head, args, query, body, by_session)
        return await route.handler(self._handlers, call)

    async def _authenticate(self, scope: Scope, for_routers: bool) -> bool:
        """The token, or the console's session (True): its cookie and its key, which the
        console's pages send in a header. The cookie alone is what another port of this host,
        or a forged request, would have: a read without the key is 401, a change 403. A wrong
        token's answer is held, or refused (429), by the throttle: the right one never is.
        The route token (`route_token`, which replicas hold to follow the routes) opens the
        watch, a read `for_routers`, and nothing else."""
        for key, value in scope["headers"]:
            if key == b"authorization":
                scheme, _, token = bytes(value).partition(b" ")
                bearer = scheme.lower() == b"bearer"
                if bearer and hmac.compare_digest(token.strip(), self._token):
                    return False
                if bearer and hmac.compare_digest(token.strip(), self._route_token):
                    if for_routers and scope["method"] in ("GET", "HEAD"):
                        return False
                    raise HTTPError(
                        403, "Forbidden", "the route token reads the watch, and nothing else"
                    )
                await self.throttle.failed(scope, "the token is wrong")
                raise HTTPError(401, "Unauthorized", "the token is wrong")
        session = self._console.session_of(scope)
        if session is not None and self._console.key_ok(scope, session):
            return True
        if session is not None and scope["method"] not in ("GET", "HEAD"):
            if not same_origin(scope):
                raise HTTPError(
                    403,
                    "CrossOrigin",
                    "a change made with the console's session must come from one of this "
                    "daemon's own pages, not from another site's",
                )
            raise HTTPError(
                403,
                "CSRFRejected",
                "a change made with the console's session needs its X-Console-Key header, "
                "from one of the console's own pages",
            )
        raise HTTPError(
            401,
            "Unauthorized",
            "an 'Authorization: Bearer <token>' header is needed (or the console's session: "
            "its cookie and its X-Console-Key header)",
        )
