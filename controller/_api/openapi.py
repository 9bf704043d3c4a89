"""The OpenAPI description of the daemon's HTTP API, served at ``/openapi.json``.

Request bodies are made from the config model itself (each field's JSON Schema sits beside its
validator in ``_model.config.config``), so that the document and the server cannot drift apart;
responses are written as the views (``views``) make them (``schemas``).
``tests/daemon/test_openapi.py`` and a schemathesis run against a real daemon check both. The
paths are here; how an operation is written, in ``operations``.
"""

from __future__ import annotations

from typing import Any

from .._model.views.status import BackendState
from .application_schemas import PATHS as APPLICATION_PATHS
from .listing import MAX_LIMIT
from .nodes import PATHS as NODE_PATHS
from .operations import (
    JSON_BODY,
    NAME,
    WRITE_ERRORS,
    answer,
    flag,
    long_poll,
    operation,
    query,
)
from .schema_parts import COUNT, MESSAGE_TEXT, SAYS, STRING
from .schemas import SCHEMAS

_DESCRIPTION = """\
The HTTP API of `controller run`. Every path but `/healthz` needs `Authorization: Bearer <token>`
(the token is in the state dir). Bodies are JSON, sent with `Content-Type: application/json`, at
most 1 MiB. A request that is refused (any 4xx) changes nothing. HEAD is answered wherever GET is,
with the same headers and no body; a method a path does not take gets 405 with `Allow`.

Deploys and deletes are asynchronous: they answer once the change is stored, and the backend then
converges. To wait, read `GET /api/v1/backends/{name}` until `goal_done` is true for the
`generation` the change returned (after a delete, until the GET answers 404), or follow
`GET /api/v1/watch`.

A deploy that changes what replicas run makes a revision, with its cause (`api` or `cli`, the
manifest and its digest, a `message`). `POST .../undo` brings an earlier revision's content back
as a new revision; `POST .../pause` records later deploys without rolling them out, until
`POST .../resume`. These answer 202 with a generation to wait for, as a deploy's.

The web console (`/`) uses this API with its session instead of the token: a cookie (HttpOnly,
SameSite=Strict, made by its login or a link from `POST /api/v1/console/links`) and the
session's key in an `X-Console-Key` header, which only the console's own pages hold (in their
origin's storage). Without the key, a read is 401 and a change 403 (CSRFRejected), as is a
change from another origin."""

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "trio-replica-controller", "version": "1", "description": _DESCRIPTION},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": SCHEMAS,
    },
    "security": [{"bearer": []}],
    "paths": {
        "/healthz": {
            "get": {
                "summary": "Liveness; needs no token",
                "security": [],
                "responses": answer("200", "The daemon answers", "Health"),
            }
        },
        "/metrics": {
            "get": operation(
                "Prometheus metrics",
                {
                    "200": {
                        "description": "The text exposition format",
                        "content": {"text/plain; version=0.0.4; charset=utf-8": {"schema": STRING}},
                    }
                },
            )
        },
        "/openapi.json": {
            "get": operation(
                "This document",
                {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {JSON_BODY: {"schema": {"type": "object"}}},
                    }
                },
            )
        },
        "/api/v1/backends": {
            "get": operation(
                "Every backend's status (or a page of them), and who leads",
                answer("200", "By name", "BackendList"),
                "400",
                parameters=[
                    query(
                        "limit",
                        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
                        "At most this many (then `next` says where the next page starts)",
                    ),
                    query("after", STRING, "Only the backends named after this (a page's `next`)"),
                    query(
                        "state",
                        {"type": "array", "items": {"enum": [s.value for s in BackendState]}},
                        "Only the backends in these states (repeated, or comma-separated)",
                    ),
                    query(
                        "view",
                        {"enum": ["full", "summary"]},
                        "summary: without each backend's replicas and events",
                    ),
                ],
                description="From a standby: the backends as the leader last wrote them to "
                "the store (replicas as its intent names them, unchecked).",
            )
        },
        "/api/v1/backends/{name}": {
            "parameters": [NAME],
            "get": {
                **operation(
                    "One backend's status", answer("200", "Its status", "BackendStatus"), "404"
                ),
                "operationId": "getBackend",
            },
            "put": {
                **operation(
                    "Deploy: create or update a backend",
                    answer("200", "Stored; the backend converges from here", "Accepted"),
                    *WRITE_ERRORS,
                    body="Backend",
                    parameters=[query("message", MESSAGE_TEXT, SAYS)],
                ),
                "operationId": "deployBackend",
            },
            "delete": {
                "operationId": "deleteBackend",
                **operation(
                    "Drain and delete a backend (asynchronous)",
                    answer("202", "Stored; its replicas drain, then it is gone", "Accepted"),
                    "400",
                    "404",
                    "503",
                    parameters=[
                        flag(
                            "force",
                            "Stop replicas without draining, and cut short drains under way; "
                            "taken even while the daemon shuts down",
                        )
                    ],
                ),
            },
        },
        "/api/v1/backends/{name}/logs": {
            "parameters": [NAME],
            "get": {
                "operationId": "getLogs",
                **operation(
                    "The logs of a backend's replicas, current and gone",
                    answer("200", "Each replica's log", "Logs"),
                    "400",
                    "404",
                    "409-log",
                    "501",
                    parameters=[
                        query("replica", STRING, "One replica's tag"),
                        query(
                            "tail",
                            {"type": "integer", "minimum": 0, "maximum": 10_000},
                            "Lines from the end of each log (100 if not given)",
                        ),
                        query(
                            "offset",
                            COUNT,
                            "Only what was written after this offset (from an earlier answer)",
                        ),
                    ],
                ),
            },
        },
        "/api/v1/backends/{name}/revisions": {
            "parameters": [NAME],
            "get": {
                "operationId": "getRevisions",
                **operation(
                    "A backend's revisions, oldest first",
                    answer("200", "Each kept revision, with its cause and outcome", "RevisionList"),
                    "404",
                ),
            },
        },
        "/api/v1/backends/{name}/undo": {
            "parameters": [NAME],
            "post": {
                "operationId": "undoBackend",
                **operation(
                    "Undo: roll back to an earlier revision's content, as a new revision",
                    answer("202", "Stored; the backend rolls back from here", "RolloutAccepted"),
                    "400",
                    "404-revision",
                    "409-rollout",
                    "413",
                    "415",
                    "422",
                    "503",
                    body="Undo",
                    body_required=False,
                    description="The scale and settings stay as they are now; only what the "
                    "replicas run goes back. Undo to the content that runs already changes "
                    "nothing. Without a body: to the last good revision.",
                ),
            },
        },
        "/api/v1/backends/{name}/restart": {
            "parameters": [NAME],
            "post": {
                "operationId": "restartBackend",
                **operation(
                    "Restart: replace every replica, running the code on disk now",
                    answer("202", "Stored; the backend rolls out from here", "RolloutAccepted"),
                    "400",
                    "404",
                    "409-rollout",
                    "413",
                    "415",
                    "422",
                    "503",
                    body="Restart",
                    body_required=False,
                    description="As `kubectl rollout restart`: a new revision with the content "
                    "the backend runs and the code on disk now, rolled out under the backend's "
                    "surge and unavailability limits (how edited code is shipped without a new "
                    "version). Refused (409) while paused or deleting.",
                ),
            },
        },
        "/api/v1/backends/{name}/scale": {
            "parameters": [NAME],
            "post": {
                "operationId": "scaleBackend",
                **operation(
                    "Scale: set how many replicas run, and change nothing else",
                    answer("200", "Stored; the backend scales from here", "Accepted"),
                    "400",
                    "404",
                    "409",
                    "413",
                    "415",
                    "422",
                    "503",
                    body="Scale",
                    description="`replicas` for a backend without autoscaling; `min_replicas` "
                    "and `max_replicas` (either or both) for an autoscaled one: the other kind "
                    "is refused with 422, as is a `min_replicas` above `max_replicas`. The "
                    "spec is read and written under the backend's lock: a deploy under way is "
                    "never undone. The same count again changes nothing. No revision is made "
                    "(what the replicas run is unchanged).",
                ),
            },
        },
        "/api/v1/backends/{name}/history": {
            "parameters": [NAME],
            "get": {
                "operationId": "getHistory",
                **operation(
                    "The last hour of the backend's desired and ready replicas and its load",
                    answer("200", "Points, oldest first (kept in the daemon's memory)", "History"),
                    "404",
                ),
            },
        },
        "/api/v1/backends/{name}/pause": {
            "parameters": [NAME],
            "post": {
                "operationId": "pauseBackend",
                **operation(
                    "Pause: record later deploys as revisions without rolling them out",
                    answer("202", "Stored (a rollout under way goes on)", "RolloutAccepted"),
                    "404",
                    "409-rollout",
                    "503",
                ),
            },
        },
        "/api/v1/backends/{name}/resume": {
            "parameters": [NAME],
            "post": {
                "operationId": "resumeBackend",
                **operation(
                    "Resume: roll out what was deployed while paused, and stop pausing",
                    answer("202", "Stored; the pending revision rolls out", "RolloutAccepted"),
                    "404",
                    "409-rollout",
                    "503",
                ),
            },
        },
        "/api/v1/apply": {
            "post": operation(
                "Deploy every backend of a manifest, all or nothing; prune deletes the others",
                answer("200", "Stored", "Applied"),
                *WRITE_ERRORS,
                body="Apply",
            )
        },
        "/api/v1/apply/diff": {
            "post": operation(
                "What an apply of this manifest would change, field by field; nothing is written",
                answer("200", "What would change", "ApplyDiff"),
                *WRITE_ERRORS,
                body="Apply",
            )
        },
        "/api/v1/load": {
            "post": operation(
                "Report an ingress's load (sent on change, and every 10 s while not zero)",
                answer("200", "Taken", "LoadTaken"),
                "400",
                "413",
                "415",
                "422",
                body="LoadReport",
            )
        },
        "/api/v1/ingress": {
            "get": operation(
                "The daemon's ingress processes: each one's state, restarts and health",
                answer("200", "Each process", "Ingress"),
            )
        },
        "/api/v1/watch": {
            "get": operation(
                "Long poll: the snapshots newer than `since`",
                answer("200", "Snapshots, or none if timeout_s passed first", "Watch"),
                "400",
                parameters=long_poll("The cursor of the last answer (0: everything)"),
            )
        },
        "/api/v1/changes": {
            "get": operation(
                "Long poll: answers once anything a status shows may have changed",
                answer("200", "The cursor now (the same one if timeout_s passed first)", "Changes"),
                "400",
                parameters=long_poll("The cursor of the last answer (none: answer at once)"),
                description="What the web console follows: after each answer with a new "
                "cursor or epoch, it reads what it shows again. Any pass of a backend's loop "
                "moves the cursor (a health check's too), so a reader should not read more "
                "than a few times a second.",
            )
        },
        "/api/v1/console/links": {
            "post": operation(
                "A one-time login link to the web console (`controller console`)",
                answer("201", "Made: open the daemon's URL with `path`", "LoginLink"),
                "403",
                description="Only with the token: a console session cannot make links.",
            )
        },
        **NODE_PATHS,
        **APPLICATION_PATHS,
        "/api/v1/shutdown": {
            "post": operation(
                "Drain and delete every backend, then stop the daemon",
                {
                    **answer("200", "Drained (`left`: what was not)", "Shutdown"),
                    **answer("202", "Started (with wait=false)", "Shutdown"),
                },
                "400",
                "503",
                parameters=[flag("wait", "Answer once the drains are over (true by default)")],
            )
        },
    },
}

# Stateful runs (and client generators) follow a deploy to what can be done with its backend.


def _canary_path(verb: str, summary: str, done: str, description: str) -> dict[str, Any]:
    """``POST /api/v1/backends/{name}/promote`` or ``.../abort``: a canary release steered."""
    return {
        "parameters": [NAME],
        "post": {
            "operationId": f"{verb}Backend",
            **operation(
                summary,
                answer("202", done, "RolloutAccepted"),
                *("400", "404", "409-rollout", "413", "415", "422", "503"),
                body="Steer",
                body_required=False,
                description=description + " Refused (409, NoCanary) unless a canary release is "
                "being judged (a `canary` block, a new version).",
            ),
        },
    }


OPENAPI["paths"]["/api/v1/backends/{name}/promote"] = _canary_path(
    "promote",
    "Promote the canary release under way: skip its remaining steps",
    "Done; the rolling replacement begins",
    "The canary's revision replaces the stable one by the rolling update.",
)
OPENAPI["paths"]["/api/v1/backends/{name}/abort"] = _canary_path(
    "abort",
    "Abort the canary release under way: back to the stable revision",
    "Done; its weight is 0 and its replicas drain",
    "The canary revision is marked failed with the step's numbers, and the stable revision's "
    "content is rolled out again as a new revision (its replicas are kept).",
)
_deployed = OPENAPI["paths"]["/api/v1/backends/{name}"]["put"]["responses"]["200"]
_deployed["links"] = {
    op: {"operationId": op, "parameters": {"name": "$response.body#/name"}}
    for op in (
        "getBackend",
        "deleteBackend",
        "getLogs",
        "getRevisions",
        "undoBackend",
        "restartBackend",
        "pauseBackend",
        "resumeBackend",
        "promoteBackend",
        "abortBackend",
    )
}
