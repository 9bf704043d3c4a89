"""The daemon's HTTP API, as an ASGI application (served by hypercorn on trio).

JSON in and out; every path but ``/healthz`` needs ``Authorization: Bearer <token>``. A rejected
request changes nothing: bodies are read in full, size-checked, parsed and validated before any
call into the controller. ``OPENAPI`` documents it all and is served at ``/openapi.json``.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, final
from urllib.parse import parse_qs

import trio

from ._controller import Controller
from ._errors import (
    ControllerClosedError,
    InfeasibleError,
    ManifestError,
    UnknownBackendError,
)
from ._manifest import BackendDecl, Manifest, config_to_dict, parse_backend, parse_manifest
from ._state import BackendSnapshot, BackendStatus

logger = logging.getLogger("controller.api")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 1 << 20
MAX_WATCH_TIMEOUT_S = 60.0
_BACKEND_PATH = re.compile(r"/api/v1/backends/([^/]+)")


class HTTPError(Exception):
    def __init__(self, status: int, kind: str, message: str, **extra: Any):
        self.status = status
        self.body = {"error": {"type": kind, "message": message, **extra}}
        super().__init__(message)


# -- JSON views --


def status_json(status: BackendStatus) -> dict[str, Any]:
    counts_by_version: dict[str, dict[str, int]] = {}
    for (version, state), n in status.counts_by_version.items():
        counts_by_version.setdefault(version, {})[state.value] = n
    return {
        "name": status.name,
        "state": status.state.value,
        "reason": status.reason,
        "message": status.message,
        "generation": status.generation,
        "observed_generation": status.observed_generation,
        "deleting": status.deleting,
        "goal_done": status.goal_done,
        "last_error": status.last_error,
        "desired": 0 if status.deleting else status.backend_config.num_replicas,
        "config": BackendDecl(status.name, status.backend_config, status.replica_config).to_dict(),
        "counts": {state.value: n for state, n in status.counts.items()},
        "counts_by_version": counts_by_version,
        "replicas": [
            {
                "tag": r.tag,
                "state": r.state.value,
                "version": r.version,
                "address": r.address,
                "healthy": r.healthy,
            }
            for r in status.replicas
        ],
        "events": [{"time": e.time, "kind": e.kind, "message": e.message} for e in status.events],
    }


def snapshot_json(snapshot: BackendSnapshot) -> dict[str, Any]:
    return {
        "name": snapshot.name,
        "snapshot_id": snapshot.snapshot_id,
        "exists": snapshot.exists,
        "config": (
            None if snapshot.backend_config is None else config_to_dict(snapshot.backend_config)
        ),
        "replicas": [
            {"tag": r.tag, "version": r.version, "address": r.address} for r in snapshot.replicas
        ],
    }


# -- the application --


@final
class Api:
    """The ASGI app. `render_metrics` gives the Prometheus text; `request_shutdown` is called
    by ``POST /api/v1/shutdown`` (the daemon then drains everything and exits)."""

    def __init__(
        self,
        controller: Controller,
        *,
        token: str,
        epoch: str,
        render_metrics: Callable[[], bytes],
        request_shutdown: Callable[[], None],
    ):
        self._ctl = controller
        self._token = token.encode()
        self._epoch = epoch
        self._render_metrics = render_metrics
        self._request_shutdown = request_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            status, body, content_type = await self._route(scope, receive)
        except HTTPError as exc:
            status, body, content_type = exc.status, _dump(exc.body), "application/json"
        except Exception:
            logger.exception("API error on %s %s", scope["method"], scope["path"])
            status = 500
            body = _dump({"error": {"type": "InternalError", "message": "see the daemon's log"}})
            content_type = "application/json"
        headers = [
            (b"content-type", content_type.encode()),
            (b"content-length", b"%d" % len(body)),
        ]
        if status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="controller"'))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _route(self, scope: Scope, receive: Receive) -> tuple[int, bytes, str]:
        method: str = scope["method"]
        path: str = scope["path"]
        if path == "/healthz" and method == "GET":
            return 200, _dump({"ok": True}), "application/json"
        self._authenticate(scope)
        body = await _read_body(receive)
        query = parse_qs(scope.get("query_string", b"").decode())
        if path == "/metrics" and method == "GET":
            return 200, self._render_metrics(), "text/plain; version=0.0.4; charset=utf-8"
        if path == "/openapi.json" and method == "GET":
            return 200, _dump(OPENAPI), "application/json"
        if path == "/api/v1/backends" and method == "GET":
            backends = [status_json(b) for b in self._ctl.status().backends]
            return _ok({"backends": backends})
        match = _BACKEND_PATH.fullmatch(path)
        if match is not None:
            name = match.group(1)
            if method == "GET":
                return _ok(status_json(self._status(name)))
            if method == "PUT":
                decl = _backend_from_body(name, _parse_json(body))
                return _ok(await self._deploy(decl), 200)
            if method == "DELETE":
                force = query.get("force", ["false"])[0] in ("1", "true")
                return _ok(await self._delete(name, force), 202)
            raise HTTPError(405, "MethodNotAllowed", f"{method} is not allowed on {path}")
        if path == "/api/v1/apply" and method == "POST":
            return _ok(await self._apply(_parse_json(body)))
        if path == "/api/v1/watch" and method == "GET":
            return _ok(await self._watch(query))
        if path == "/api/v1/shutdown" and method == "POST":
            self._request_shutdown()
            return _ok({"shutting_down": True}, 202)
        raise HTTPError(404, "NotFound", f"no such endpoint: {method} {path}")

    def _authenticate(self, scope: Scope) -> None:
        for key, value in scope["headers"]:
            if key == b"authorization":
                scheme, _, token = bytes(value).partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._token):
                    return
                raise HTTPError(401, "Unauthorized", "the token is wrong")
        raise HTTPError(401, "Unauthorized", "an 'Authorization: Bearer <token>' header is needed")

    def _status(self, name: str) -> BackendStatus:
        try:
            return self._ctl.status(name)
        except UnknownBackendError as exc:
            raise HTTPError(404, "UnknownBackend", str(exc)) from None

    async def _deploy(self, decl: BackendDecl) -> dict[str, Any]:
        try:
            goal = await self._ctl.deploy(decl.name, decl.backend_config, decl.replica_config)
        except InfeasibleError as exc:
            raise HTTPError(409, "Infeasible", str(exc)) from None
        except ControllerClosedError as exc:
            raise HTTPError(503, "ShuttingDown", str(exc)) from None
        return {"name": decl.name, "generation": goal.generation}

    async def _delete(self, name: str, force: bool) -> dict[str, Any]:
        try:
            goal = await self._ctl.delete(name, force=force)
        except UnknownBackendError as exc:
            raise HTTPError(404, "UnknownBackend", str(exc)) from None
        except ControllerClosedError as exc:
            raise HTTPError(503, "ShuttingDown", str(exc)) from None
        return {"name": name, "generation": goal.generation}

    async def _apply(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise HTTPError(422, "Invalid", "the body must be an object")
        unknown = sorted(set(data) - {"backends", "prune", "source"})
        if unknown:
            raise HTTPError(422, "Invalid", f"unknown fields: {', '.join(unknown)}")
        prune = data.get("prune", False)
        if not isinstance(prune, bool):
            raise HTTPError(422, "Invalid", "prune: must be true or false")
        source = data.get("source", "the request body")
        if not isinstance(source, str):
            raise HTTPError(422, "Invalid", "source: must be a string")
        try:
            manifest = parse_manifest({"backends": data.get("backends", {})}, source)
        except ManifestError as exc:
            raise HTTPError(422, "InvalidManifest", str(exc), problems=exc.problems) from None
        return await apply_manifest(self._ctl, manifest, prune=prune)

    async def _watch(self, query: dict[str, list[str]]) -> dict[str, Any]:
        try:
            since = int(query.get("since", ["0"])[0])
            timeout = float(query.get("timeout_s", ["30"])[0])
        except ValueError:
            raise HTTPError(
                400, "BadQuery", "since must be an integer, timeout_s a number"
            ) from None
        if not 0 <= timeout <= MAX_WATCH_TIMEOUT_S:
            raise HTTPError(400, "BadQuery", f"timeout_s must be in [0, {MAX_WATCH_TIMEOUT_S:g}]")
        if query.get("epoch", [self._epoch])[0] != self._epoch:
            since = 0  # a restarted daemon counts afresh: the caller gets everything
        snapshots: list[BackendSnapshot] = []
        with trio.move_on_after(timeout):
            snapshots = await self._ctl.changes_since(since)
        cursor = max([since, *(s.snapshot_id for s in snapshots)])
        return {
            "epoch": self._epoch,
            "cursor": cursor,
            "snapshots": [snapshot_json(s) for s in snapshots],
        }


async def apply_manifest(ctl: Controller, manifest: Manifest, *, prune: bool) -> dict[str, Any]:
    """Deploy every backend of `manifest` (and, with `prune`, delete the others). Deploys of an
    unchanged spec change nothing. Stops at the first infeasible backend (409, saying which were
    applied before it)."""
    applied: list[dict[str, Any]] = []
    for decl in manifest.backends:
        try:
            before = ctl.status(decl.name).generation
        except UnknownBackendError:
            before = 0
        try:
            goal = await ctl.deploy(decl.name, decl.backend_config, decl.replica_config)
        except InfeasibleError as exc:
            done = ", ".join(a["name"] for a in applied) or "none"
            raise HTTPError(
                409, "Infeasible", f"{exc} (applied before it: {done})", applied=applied
            ) from None
        applied.append(
            {"name": decl.name, "generation": goal.generation, "changed": goal.generation != before}
        )
    deleted: list[dict[str, Any]] = []
    if prune:
        keep = set(manifest.names)
        for status in ctl.status().backends:
            if status.name not in keep and not status.deleting:
                goal = await ctl.delete(status.name)
                deleted.append({"name": status.name, "generation": goal.generation})
    return {"applied": applied, "deleted": deleted}


def _backend_from_body(name: str, data: Any) -> BackendDecl:
    decl, problems = parse_backend(name, data)
    if decl is None:
        raise HTTPError(422, "InvalidBackend", "; ".join(problems), problems=problems)
    return decl


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HTTPError(400, "Disconnected", "the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise HTTPError(413, "TooLarge", f"the body is over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _parse_json(body: bytes) -> Any:
    if not body:
        raise HTTPError(400, "EmptyBody", "a JSON body is needed")
    try:
        return json.loads(body)
    except RecursionError:
        raise HTTPError(400, "MalformedJSON", "the JSON is nested too deeply") from None
    except ValueError as exc:
        raise HTTPError(400, "MalformedJSON", f"the body is not valid JSON: {exc}") from None


def _ok(data: Any, status: int = 200) -> tuple[int, bytes, str]:
    return status, _dump(data), "application/json"


def _dump(data: Any) -> bytes:
    return json.dumps(data).encode()


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


_ERROR = {"$ref": "#/components/schemas/Error"}


def _op(summary: str, ok: str, *errors: str, body: str | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            ok: {"description": "done"},
            **{
                code: {
                    "description": "error",
                    "content": {"application/json": {"schema": _ERROR}},
                }
                for code in ("401", *errors)
            },
        },
    }
    if body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}},
        }
    return op


_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}

OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "trio-replica-controller", "version": "1"},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {
                            "type": {"type": "string"},
                            "message": {"type": "string"},
                            "problems": {"type": "array", "items": {"type": "string"}},
                        },
                    }
                },
            },
            "Backend": {
                "type": "object",
                "description": "BackendConfig and ReplicaConfig fields side by side; "
                "entrypoint is required, unknown fields are rejected",
                "required": ["entrypoint"],
                "properties": {
                    "entrypoint": {"type": "string"},
                    "init_args": {"type": "array"},
                    "init_kwargs": {"type": "object"},
                    "num_replicas": {"type": "integer", "minimum": 0},
                    "version": {"type": "string", "nullable": True},
                    "user_config": {},
                    "graceful_shutdown_timeout_s": {"type": "number"},
                    "start_timeout_s": {"type": "number"},
                    "resources": {"type": "object"},
                    "max_surge": {"type": "number"},
                    "max_unavailable": {"type": "number"},
                    "health_check_period_s": {"type": "number"},
                    "health_check_timeout_s": {"type": "number"},
                    "health_check_failure_threshold": {"type": "integer"},
                },
                "additionalProperties": False,
            },
            "Apply": {
                "type": "object",
                "properties": {
                    "backends": {
                        "type": "object",
                        "additionalProperties": {"$ref": "#/components/schemas/Backend"},
                    },
                    "prune": {"type": "boolean"},
                    "source": {"type": "string"},
                },
                "additionalProperties": False,
            },
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/healthz": {"get": {**_op("Liveness; needs no token", "200"), "security": []}},
        "/metrics": {"get": _op("Prometheus metrics (text format)", "200")},
        "/openapi.json": {"get": _op("This document", "200")},
        "/api/v1/backends": {"get": _op("Every backend's status", "200")},
        "/api/v1/backends/{name}": {
            "parameters": [_NAME],
            "get": _op("One backend's status", "200", "404"),
            "put": _op(
                "Deploy (create or update)", "200", "400", "409", "413", "422", body="Backend"
            ),
            "delete": {
                **_op("Drain and delete", "202", "404"),
                "parameters": [{"name": "force", "in": "query", "schema": {"type": "boolean"}}],
            },
        },
        "/api/v1/apply": {
            "post": _op(
                "Deploy every backend of a manifest; prune deletes the others",
                "200",
                "400",
                "409",
                "413",
                "422",
                body="Apply",
            )
        },
        "/api/v1/watch": {
            "get": {
                **_op("Long poll: snapshots newer than `since`", "200", "400"),
                "parameters": [
                    {"name": "since", "in": "query", "schema": {"type": "integer"}},
                    {"name": "epoch", "in": "query", "schema": {"type": "string"}},
                    {"name": "timeout_s", "in": "query", "schema": {"type": "number"}},
                ],
            }
        },
        "/api/v1/shutdown": {"post": _op("Drain and delete everything, then exit", "202")},
    },
}
