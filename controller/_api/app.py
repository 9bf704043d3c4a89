"""The daemon's HTTP API, as an ASGI application (served by hypercorn on trio).

JSON in and out; every path but ``/healthz`` needs ``Authorization: Bearer <token>``. A rejected
request changes nothing: bodies are read in full, size-checked, parsed and validated before any
call into the controller. ``OPENAPI`` documents it all and is served at ``/openapi.json``.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, final
from urllib.parse import parse_qs

import attrs
import trio

from .._core.controller import Controller
from .._core.rollouts import with_code_checked
from .._local.logs import LogChunk
from .._model.errors import (
    ControllerError,
    ManifestError,
    UnknownBackendError,
)
from .._model.load_report import parse_load_body
from .._model.manifest import BackendDecl, parse_manifest
from .._model.revisions import Cause
from .._model.status import BackendSnapshot, BackendStatus
from .bodies import (
    backend_from_body,
    cause_of,
    optional_json,
    scale_request,
    undo_request,
)
from .console import Console
from .errors import domain_error
from .http import (
    HTTPError,
    Receive,
    Scope,
    Send,
    check_method,
    dump,
    flag,
    int_param,
    lifespan,
    number_param,
    ok,
    parse_json,
    path_of,
    read_body,
)
from .listing import list_backends
from .openapi import OPENAPI
from .serving import Serving
from .timeline import Timelines
from .views import applied_json, revision_json, snapshot_json, status_json

logger = logging.getLogger("controller.api")

MAX_WATCH_TIMEOUT_S = 60.0
MAX_LOG_LINES = 10_000


class LogSource(Protocol):
    """Where replicas' logs are read from (LocalRuntime is one)."""

    def log_tags(self, backend: str | None = None) -> list[str]: ...

    def read_log(
        self, tag: str, *, offset: int | None = None, tail: int = 100
    ) -> LogChunk | None: ...


# -- the application --


class IngressView(Protocol):
    """The daemon's ingress processes, as the API shows them."""

    async def status(self) -> dict[str, Any]: ...

    async def metrics(self) -> bytes:
        """Their Prometheus text, summed."""
        ...


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
        self._render_metrics = render_metrics
        self._request_shutdown = request_shutdown
        self._shutdown_done = shutdown_done
        self._shutting_down = False
        self._logs = logs
        self._console = console if console is not None else Console(token)
        self._timelines = timelines if timelines is not None else Timelines()
        self._ingress = ingress

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

    @property
    def _ctl(self) -> Controller:
        ctl = self._serving.ctl
        if ctl is None:
            raise HTTPError(503, "Starting", "the daemon is starting; try again", retry_after=1)
        return ctl

    @property
    def _epoch(self) -> str:
        return self._serving.epoch

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
                "this daemon is a standby and no daemon leads just now (a takeover is under "
                "way); nothing was changed, try again",
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
        route, args = _find(path)
        # Every path but the public ones needs the token (or the console's session), even to
        # learn that it does not exist.
        by_session = False if route is not None and route.public else self._authenticate(scope)
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
        return await route.handler(self, call)

    # -- the handlers, one a path (see `_ROUTES`) --

    async def _healthz(self, call: Call) -> Answer:
        return 200, dump({"ok": True}), "application/json"

    async def _metrics(self, call: Call) -> Answer:
        text = self._render_metrics()
        if self._ingress is not None:
            text += await self._ingress.metrics()
        return 200, text, "text/plain; version=0.0.4; charset=utf-8"

    async def _openapi(self, call: Call) -> Answer:
        return 200, dump(OPENAPI), "application/json"

    async def _ingress_status(self, call: Call) -> Answer:
        if self._ingress is None:
            return ok({"listen": None, "workers": 0, "processes": []})
        return ok(await self._ingress.status())

    async def _backends(self, call: Call) -> Answer:
        listed = list_backends(self._ctl, call.query)
        leadership = self._serving.leadership_json()
        if leadership is not None:
            listed["leadership"] = leadership
        return ok(listed)

    async def _backend(self, call: Call) -> Answer:
        (name,) = call.args
        if call.method == "GET":
            return ok(status_json(self._status(name)))
        if call.method == "PUT":
            decl = backend_from_body(name, parse_json(call.body))
            cause = cause_of(via="api", message=call.query.get("message", [None])[-1])
            self._check_accepting()
            return ok(await self._deploy(decl, cause), 200)
        force = flag(call.query, "force", default=False)  # DELETE
        if not force:
            # A forced delete is taken even while shutting down: it only cuts short the
            # drains a shutdown waits for (a replica that hangs in its drain).
            self._check_accepting()
        return ok(await self._delete(name, force), 202)

    async def _logs_of(self, call: Call) -> Answer:
        return ok(await self._read_logs(call.args[0], call.query))

    async def _revisions_of(self, call: Call) -> Answer:
        return ok(await self._revisions(call.args[0]))

    async def _steer(self, call: Call) -> Answer:
        name, what = call.args
        if what == "undo":
            to_revision, force, cause = undo_request(await optional_json(call.scope, call.receive))
            cause = _by(cause, call.by_session)
            self._check_accepting()
            await self._ctl.undo(name, to_revision, force=force, cause=cause)
        else:
            # Nothing to say but the name: any body is ignored, as the shutdown's is.
            self._check_accepting()
            await (self._ctl.pause if what == "pause" else self._ctl.resume)(name)
        return ok(self._steered(name), 202)

    async def _scale(self, call: Call) -> Answer:
        (name,) = call.args
        replicas, bounds, message = scale_request(await optional_json(call.scope, call.receive))
        cause = _by(cause_of(via="api", message=message), call.by_session)
        self._check_accepting()
        goal = await self._ctl.scale(name, replicas, cause=cause, **bounds)
        return ok({"name": name, "generation": goal.generation})

    async def _history_of(self, call: Call) -> Answer:
        (name,) = call.args
        self._status(name)  # 404 for no such backend
        return ok(self._timelines.json(name))

    async def _changes_since(self, call: Call) -> Answer:
        return ok(await self._changes(call.query, wait=not call.head))

    async def _login_link(self, call: Call) -> Answer:
        if call.by_session:
            raise HTTPError(
                403, "TokenNeeded", "a login link is made with the token, not a session"
            )
        code = self._console.sessions.new_link_code()
        return ok({"code": code, "path": f"/login#code={code}"}, 201)

    async def _apply_body(self, call: Call) -> Answer:
        data = parse_json(call.body)
        self._check_accepting()
        return ok(await self._apply(data))

    async def _watch_since(self, call: Call) -> Answer:
        # HEAD: checked as a GET is, answered without the wait.
        return ok(await self._watch(call.query, wait=not call.head))

    async def _load(self, call: Call) -> Answer:
        return ok(self._take_load(parse_json(call.body)))

    async def _shutdown_call(self, call: Call) -> Answer:
        wait = flag(call.query, "wait", default=True)
        return ok(await self._shutdown(wait=wait), 200 if wait else 202)

    def _take_load(self, data: Any) -> dict[str, Any]:
        try:
            reports = parse_load_body(data)
        except ValueError as exc:
            raise HTTPError(422, "InvalidLoad", str(exc)) from None
        taken: list[str] = []
        unknown: list[str] = []
        for report in reports:
            (taken if self._ctl.report_load(report) else unknown).append(report.backend)
        return {"taken": taken, "unknown": unknown}

    def _check_accepting(self) -> None:
        if self._shutting_down:
            raise HTTPError(
                503, "ShuttingDown", "the daemon is shutting down: it takes no more changes"
            )

    async def _shutdown(self, *, wait: bool) -> dict[str, Any]:
        self._check_accepting()
        # No change may slip in behind the deletes: refused from now on (unless they fail).
        self._shutting_down = True
        try:
            applied = await self._ctl.apply({}, prune=True)
        except BaseException:
            self._shutting_down = False
            raise
        deleting = sorted(applied.deleted)
        self._request_shutdown()
        if not wait or self._shutdown_done is None:
            return {"shutting_down": True, "deleting": deleting}
        # Answered once every drain is over: the caller learns what was left, if anything,
        # before the daemon goes away.
        left = await self._shutdown_done()
        return {"shutting_down": True, "deleting": deleting, "left": left}

    def _authenticate(self, scope: Scope) -> bool:
        """The token, or the console's session (True): its cookie and its key, which the
        console's pages send in a header. The cookie alone is what another port of this host,
        or a forged request, would have: a read without the key is 401, a change 403."""
        for key, value in scope["headers"]:
            if key == b"authorization":
                scheme, _, token = bytes(value).partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._token):
                    return False
                raise HTTPError(401, "Unauthorized", "the token is wrong")
        session = self._console.session_of(scope)
        if session is not None and self._console.key_ok(scope, session):
            return True
        if session is not None and scope["method"] not in ("GET", "HEAD"):
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

    def _status(self, name: str) -> BackendStatus:
        return self._ctl.status(name)

    async def _deploy(self, decl: BackendDecl, cause: Cause) -> dict[str, Any]:
        goal = await self._ctl.deploy(
            decl.name, decl.backend_config, decl.replica_config, cause=cause
        )
        return {"name": decl.name, "generation": goal.generation}

    async def _revisions(self, name: str) -> dict[str, Any]:
        # Reading the sources (a package's files) is not for the loop's thread.
        kept = self._ctl.revisions(name, check_code=False)
        revisions = await trio.to_thread.run_sync(with_code_checked, kept, self._ctl.code_path)
        rollout = self._ctl.status(name).rollout
        current = None if rollout is None else rollout.revision
        return {
            "name": name,
            "revisions": [revision_json(r, current=r.number == current) for r in revisions],
        }

    def _steered(self, name: str) -> dict[str, Any]:
        """What an undo, a pause or a resume left: the spec's generation (a goal to wait
        for) and where the backend's rollout stands."""
        status = self._ctl.status(name)
        rollout = status.rollout
        return {
            "name": name,
            "generation": status.generation,
            "revision": None if rollout is None else rollout.revision,
            "restores": None if rollout is None else rollout.restores,
            "paused": rollout is not None and rollout.paused,
            "pending_revision": None if rollout is None else rollout.pending_revision,
        }

    async def _delete(self, name: str, force: bool) -> dict[str, Any]:
        goal = await self._ctl.delete(name, force=force)
        return {"name": name, "generation": goal.generation}

    async def _read_logs(self, name: str, query: dict[str, list[str]]) -> dict[str, Any]:
        """The logs of a backend's replicas: its current ones and the kept logs of those gone
        (``?replica=TAG`` for one; ``tail`` lines each; with ``offset``, only what is new)."""
        if self._logs is None:
            raise HTTPError(
                501,
                "NoLogs",
                "this runtime keeps no replica logs the daemon can read; with the ray runtime, "
                "use Ray's own logs (`ray logs actor --id ...`)",
            )
        tail = int_param(query, "tail", 100)
        offset = int_param(query, "offset", None)
        if not 0 <= tail <= MAX_LOG_LINES or (offset is not None and offset < 0):
            raise HTTPError(400, "BadQuery", f"tail must be in [0, {MAX_LOG_LINES}], offset >= 0")
        try:
            current = {r.tag: r.state.value for r in self._ctl.status(name).replicas}
            exists = True
        except UnknownBackendError:
            current, exists = {}, False
        logs = self._logs
        # Directory listings and file reads: in a thread, never on the loop's.
        tags = await trio.to_thread.run_sync(logs.log_tags, name)
        wanted = query.get("replica", [None])[0]
        if wanted is not None:
            if wanted.rpartition("#")[0] != name or wanted not in tags:
                raise HTTPError(
                    404, "NoSuchLog", f"no log of replica {wanted!r} in backend {name!r}"
                )
            tags = [wanted]
        elif not tags and not current:
            raise HTTPError(404, "UnknownBackend", f"backend {name!r} has no replicas or logs")

        def read() -> list[dict[str, Any]]:
            out = []
            for tag in tags:
                chunk = logs.read_log(tag, offset=offset, tail=tail)
                if chunk is not None:
                    state = current.get(tag, "GONE")
                    out.append(
                        {"replica": tag, "state": state, "text": chunk.text, "offset": chunk.offset}
                    )
            return out

        return {"name": name, "exists": exists, "logs": await trio.to_thread.run_sync(read)}

    async def _apply(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise HTTPError(422, "Invalid", "the body must be an object")
        fields = {"backends", "prune", "source", "message", "source_digest", "via"}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise HTTPError(422, "Invalid", f"unknown fields: {', '.join(unknown)}")
        prune = data.get("prune", False)
        if not isinstance(prune, bool):
            raise HTTPError(422, "Invalid", "prune: must be true or false")
        source = data.get("source", "the request body")
        if not isinstance(source, str):
            raise HTTPError(422, "Invalid", "source: must be a string")
        # The manifest a person applied is named in its revisions' history: the file (as the
        # CLI sends it) and the digest of its bytes, which tells two versions of it apart.
        cause = cause_of(
            via=data.get("via", "api"),
            message=data.get("message"),
            manifest=data.get("source"),
            manifest_digest=data.get("source_digest"),
        )
        try:
            # Two backends claiming one route is a conflict (409), as when the route is
            # another's already, not a fault of the body's shape: the schema holds each alone.
            manifest = parse_manifest(
                {"backends": data.get("backends", {})}, source, check_routes=False
            )
        except ManifestError as exc:
            raise HTTPError(422, "InvalidManifest", str(exc), problems=exc.problems) from None
        return applied_json(await self._ctl.apply_manifest(manifest, prune=prune, cause=cause))

    async def _changes(self, query: dict[str, list[str]], *, wait: bool) -> dict[str, Any]:
        """The console's long poll: answers once anything a status shows may have changed
        after the caller's cursor (a pass of any backend's loop, or a switch of what this
        daemon serves from: a new epoch), or at the timeout with the cursor unchanged."""
        since = int_param(query, "since", None)
        timeout = number_param(query, "timeout_s", 30.0)
        if not 0 <= timeout <= MAX_WATCH_TIMEOUT_S:
            raise HTTPError(400, "BadQuery", f"timeout_s must be in [0, {MAX_WATCH_TIMEOUT_S:g}]")
        ctl, epoch = self._ctl, self._epoch
        if wait and since == ctl.passes and query.get("epoch", [None])[0] == epoch:
            with trio.move_on_after(timeout):
                await self._serving.wait_changed(ctl, since)
        now = self._ctl
        return {"epoch": self._epoch, "cursor": now.passes}

    async def _watch(self, query: dict[str, list[str]], *, wait: bool = True) -> dict[str, Any]:
        since = int_param(query, "since", 0)
        timeout = number_param(query, "timeout_s", 30.0)
        if not 0 <= timeout <= MAX_WATCH_TIMEOUT_S:
            raise HTTPError(400, "BadQuery", f"timeout_s must be in [0, {MAX_WATCH_TIMEOUT_S:g}]")
        if not wait:
            timeout = 0.0
        ctl, epoch = self._ctl, self._epoch
        if query.get("epoch", [epoch])[0] != epoch:
            since = 0  # a restarted daemon counts afresh: the caller gets everything
        # Only the newest deletions are kept: a cursor older than that gets every backend,
        # marked complete, so that the watcher drops what it holds and the answer omits.
        # A cursor from the future (never handed out by this daemon) is treated like one from
        # before a restart: the caller gets everything, rather than nothing until it is reached.
        complete = not ctl.watch_floor <= since <= ctl.watch_cursor or since == 0
        found: list[BackendSnapshot] | None = []
        with trio.move_on_after(timeout):
            found = await self._serving.changes_since(ctl, 0 if complete else since)
        if found is None:
            # The daemon began or stopped leading meanwhile: nothing from here, and the
            # watcher's next call (with this epoch, no longer the daemon's) gets everything.
            return {"epoch": epoch, "cursor": since, "complete": False, "snapshots": []}
        cursor = max([0 if complete else since, *(s.snapshot_id for s in found)])
        return {
            "epoch": epoch,
            "cursor": cursor,
            "complete": complete,
            "snapshots": [snapshot_json(s) for s in found],
        }


def _by(cause: Cause, by_session: bool) -> Cause:
    """A change asked from the console says so in its revision's history."""
    return attrs.evolve(cause, via="console") if by_session else cause


# -- the routes --

#: An answer: status, body, content type.
Answer = tuple[int, bytes, str]


@attrs.frozen
class Call:
    """One request, as its handler sees it."""

    scope: Scope
    receive: Receive
    method: str
    """The method; ``GET`` for a ``HEAD`` (then `head`)."""
    head: bool
    args: tuple[str, ...]
    """What the path's pattern matched (a backend's name, say)."""
    query: dict[str, list[str]]
    body: bytes
    """Read for the methods of the route's `bodies` only; else empty."""
    by_session: bool
    """Made with the console's session (not the token)."""


Handler = Callable[["Api", Call], Awaitable[Answer]]


@attrs.frozen
class Route:
    """A path of the API: the methods it takes (HEAD wherever GET is; any other gets 405 with
    Allow) and its handler."""

    pattern: re.Pattern[str]
    methods: tuple[str, ...]
    handler: Handler
    bodies: frozenset[str] = frozenset()
    """The methods whose request body it reads."""
    public: bool = False
    """Answered without the token."""
    anywhere: bool = False
    """A change this daemon takes while it stands by (a login link is its own)."""


def _path(pattern: str, methods: str, handler: Handler, **flags: Any) -> Route:
    return Route(re.compile(pattern), tuple(methods.split()), handler, **flags)


_NAME = r"/api/v1/backends/([^/]+)"
_ROUTES = [
    _path(r"/healthz", "GET HEAD", Api._healthz, public=True),
    _path(r"/metrics", "GET HEAD", Api._metrics),
    _path(r"/openapi\.json", "GET HEAD", Api._openapi),
    _path(r"/api/v1/ingress", "GET HEAD", Api._ingress_status),
    _path(r"/api/v1/backends", "GET HEAD", Api._backends),
    _path(_NAME, "GET HEAD PUT DELETE", Api._backend, bodies=frozenset({"PUT"})),
    _path(_NAME + "/logs", "GET HEAD", Api._logs_of),
    _path(_NAME + "/revisions", "GET HEAD", Api._revisions_of),
    _path(_NAME + "/(undo|pause|resume)", "POST", Api._steer),
    _path(_NAME + "/scale", "POST", Api._scale),
    _path(_NAME + "/history", "GET HEAD", Api._history_of),
    _path(r"/api/v1/changes", "GET HEAD", Api._changes_since),
    _path(r"/api/v1/console/links", "POST", Api._login_link, anywhere=True),
    _path(r"/api/v1/apply", "POST", Api._apply_body, bodies=frozenset({"POST"})),
    _path(r"/api/v1/watch", "GET HEAD", Api._watch_since),
    _path(r"/api/v1/load", "POST", Api._load, bodies=frozenset({"POST"})),
    _path(r"/api/v1/shutdown", "POST", Api._shutdown_call),
]


def _find(path: str) -> tuple[Route | None, tuple[str, ...]]:
    """The route of `path`, and what its pattern matched."""
    for route in _ROUTES:
        match = route.pattern.fullmatch(path)
        if match is not None:
            return route, match.groups()
    return None, ()
