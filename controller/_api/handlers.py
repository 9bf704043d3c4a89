"""What each path of the API does: a handler a path, and the reads and changes of the
controller it makes. ``app`` is the ASGI plumbing around them; ``routes``, which path is whose."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, final

import attrs
import trio

from .._backend.turns import in_turns, take_turns
from .._core.controller import Controller
from .._core.rollouts import with_code_checked
from .._model.config.cause import Cause
from .._model.config.manifest import BackendDecl, Manifest, manifest_steps
from .._model.records.revisions import Revision
from .._model.values.errors import ManifestError, UnknownBackendError
from .._model.views.load_report import parse_load_body
from .._model.views.status import BackendSnapshot, BackendStatus
from .._ports.runtime import LogSource
from .bodies import (
    backend_from_body,
    cause_of,
    optional_json,
    restart_request,
    scale_request,
    steer_request,
    undo_request,
)
from .console import Console
from .http import (
    HTTPError,
    Receive,
    Scope,
    dump,
    flag,
    int_param,
    number_param,
    ok,
    parse_json,
)
from .listing import list_backends
from .logs import read_logs
from .nodes import node_json, steer_node
from .openapi import OPENAPI
from .serving import Serving
from .timeline import Timelines
from .views import applied_json, diff_json, revision_json, snapshot_json, status_json

MAX_WATCH_TIMEOUT_S = 60.0

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


class IngressView(Protocol):
    """The daemon's ingress processes, as the API shows them."""

    async def status(self) -> dict[str, Any]: ...

    async def metrics(self) -> bytes:
        """Their Prometheus text, summed."""
        ...


@final
class Handlers:
    """The API's handlers, a part of its ASGI app (`Api`, which authenticates and routes each
    call here): each answers a `Call` from what the daemon serves now. Its own state is
    whether a shutdown was asked (from then on, changes are refused)."""

    def __init__(
        self,
        serving: Serving,
        *,
        render_metrics: Callable[[], bytes],
        request_shutdown: Callable[[], None],
        shutdown_done: Callable[[], Awaitable[list[str]]] | None,
        logs: LogSource | None,
        console: Console,
        timelines: Timelines,
        ingress: IngressView | None,
    ):
        self._serving = serving
        self._render_metrics = render_metrics
        self._request_shutdown = request_shutdown
        self._shutdown_done = shutdown_done
        self._shutting_down = False
        self._logs = logs
        self._console = console
        self._timelines = timelines
        self._ingress = ingress

    @property
    def _ctl(self) -> Controller:
        ctl = self._serving.ctl
        if ctl is None:
            raise HTTPError(503, "Starting", "the daemon is starting; try again", retry_after=1)
        return ctl

    @property
    def _epoch(self) -> str:
        return self._serving.epoch

    # -- the handlers, one a path (see ``routes``) --

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
            status = status_json(self._status(name))
            status["code_changed"] = (await self._code_changed([name]))[name]
            return ok(status)
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
        return ok(await read_logs(self._logs, self._status, call.args[0], call.query))

    async def _revisions_of(self, call: Call) -> Answer:
        return ok(await self._revisions(call.args[0]))

    async def _steer(self, call: Call) -> Answer:
        name, what = call.args
        if what == "undo":
            to_revision, force, cause = undo_request(await optional_json(call.scope, call.receive))
            cause = by_console(cause, call.by_session)
            self._check_accepting()
            await self._ctl.undo(name, to_revision, force=force, cause=cause)
        elif what == "restart":
            body = await optional_json(call.scope, call.receive)
            cause = by_console(restart_request(body), call.by_session)
            self._check_accepting()
            await self._ctl.restart(name, cause=cause)
        elif what in ("promote", "abort"):
            body = await optional_json(call.scope, call.receive)
            via = by_console(steer_request(body), call.by_session).via
            self._check_accepting()
            await (self._ctl.promote if what == "promote" else self._ctl.abort)(name, via=via)
        else:
            # Nothing to say but the name: any body is ignored, as the shutdown's is.
            self._check_accepting()
            await (self._ctl.pause if what == "pause" else self._ctl.resume)(name)
        return ok(self._steered(name), 202)

    async def _scale(self, call: Call) -> Answer:
        (name,) = call.args
        replicas, bounds, message = scale_request(await optional_json(call.scope, call.receive))
        cause = by_console(cause_of(via="api", message=message), call.by_session)
        self._check_accepting()
        goal = await self._ctl.scale(name, replicas, cause=cause, **bounds)
        return ok({"name": name, "generation": goal.generation})

    async def _nodes(self, call: Call) -> Answer:
        rows = await self._ctl.nodes()
        entrances: dict[str, list[str | None]] = {}
        if self._ingress is not None:
            for entry in (await self._ingress.status()).get("nodes", []):
                entrances.setdefault(entry["node"], []).append(entry["address"])
        return ok({"nodes": [node_json(row, entrances.get(row.id, [])) for row in rows]})

    async def _steer_node(self, call: Call) -> Answer:
        node, what = call.args
        body = await optional_json(call.scope, call.receive)
        self._check_accepting()
        return ok(node_json(await steer_node(self._ctl, node, what, body)), 202)

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

    async def _diff_body(self, call: Call) -> Answer:
        manifest, prune, _cause = await self._apply_request(parse_json(call.body))
        return ok(diff_json(await self._ctl.preview_manifest(manifest, prune=prune)))

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
        """What an undo, a restart, a pause or a resume left: the spec's generation (a goal to wait
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

    async def _apply(self, data: Any) -> dict[str, Any]:
        manifest, prune, cause = await self._apply_request(data)
        applied = await self._ctl.apply_manifest(manifest, prune=prune, cause=cause)
        answer = applied_json(applied, await self._code_changed(list(applied.goals)))
        if manifest.applications:
            apps = self._ctl.applications
            answer["applications"] = [
                {"name": a.name, "revision": apps.status(a.name).revision}
                for a in manifest.applications
            ]
        return answer

    async def _code_changed(self, names: list[str]) -> dict[str, bool | None]:
        """For each backend, whether the source on disk of the revision its spec runs is not
        what that revision recorded (None: cannot tell, or gone meanwhile)."""
        running: dict[str, Revision | None] = {}
        for name in names:
            try:
                rollout = self._ctl.status(name).rollout
                kept = self._ctl.revisions(name, check_code=False)
            except UnknownBackendError:  # deleted meanwhile
                rollout, kept = None, ()
            number = None if rollout is None else rollout.revision
            running[name] = next((r for r in kept if r.number == number), None)
            await take_turns(len(running))
        # Only pinned code can have changed; reading the sources (a package's files, each
        # entrypoint once) is not for the loop's thread.
        pinned = [r for r in running.values() if r is not None and r.code is not None]
        checked = {}
        if pinned:
            found = await trio.to_thread.run_sync(with_code_checked, pinned, self._ctl.code_path)
            checked = {id(r): c.code_changed for r, c in zip(pinned, found, strict=True)}
        return {name: checked.get(id(r)) for name, r in running.items()}

    async def _apply_request(self, data: Any) -> tuple[Manifest, bool, Cause]:
        """An apply's body, checked: the manifest, whether to prune, and the cause."""
        if not isinstance(data, dict):
            raise HTTPError(422, "Invalid", "the body must be an object")
        fields = {"backends", "applications", "prune", "source", "message", "source_digest", "via"}
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
        backends = data.get("backends", {})
        body = {"backends": backends}
        if "applications" in data:
            body["applications"] = data["applications"]
        # Two backends claiming one route is a conflict (409), as when the route is another's
        # already, not a fault of the body's shape: the schema holds each alone.
        try:
            # ~0.1 ms a backend: thousands would stall the loop (and the lease) for seconds.
            # In steps, with the loop's turns between them: not in a thread, whose hold on
            # the GIL held every request meanwhile up by 100-150 ms.
            manifest = await in_turns(manifest_steps(body, source, check_routes=False))
        except ManifestError as exc:
            raise HTTPError(422, "InvalidManifest", str(exc), problems=exc.problems) from None
        return manifest, prune, cause

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


def by_console(cause: Cause, by_session: bool) -> Cause:
    """A change asked from the console says so in its revision's history."""
    return attrs.evolve(cause, via="console") if by_session else cause
