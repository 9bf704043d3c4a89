"""The OpenAPI description of the daemon's HTTP API, served at ``/openapi.json``.

Request bodies are made from the config model itself (each field's JSON Schema sits beside its
validator in ``_config``), so that the document and the server cannot drift apart; responses are
written here as the views (``_views``) make them. ``tests/test_openapi.py`` and a schemathesis run
against a real daemon check both.
"""

from __future__ import annotations

from typing import Any, get_args

from ._config import NAME_PATTERN, BackendConfig, ReplicaConfig, field_schemas
from ._load_wire import MAX_LOAD_BACKENDS, MAX_LOAD_COUNT, MAX_LOAD_REPLICAS, SOURCE_PATTERN
from ._revisions import MAX_MANIFEST, MAX_MESSAGE, VIA, RevisionOutcome
from ._state import BackendState, ReplicaState


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    """An object with exactly these properties (those in `required` always present)."""
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **optional},
        "additionalProperties": False,
    }


_STRING = {"type": "string"}
_INT = {"type": "integer"}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
_BOOL = {"type": "boolean"}
_NULLABLE_STRING = {"type": ["string", "null"]}
_JSON_BODY = "application/json"
#: The largest revision number a request may name (a signed 64-bit integer's, as for counts in
#: a query): a larger one is a mistake, refused as such rather than looked for.
MAX_REVISION = 2**63 - 1
_REVISION = {"type": "integer", "minimum": 1}
_NULLABLE_REVISION = {"type": ["integer", "null"], "minimum": 1}
#: One line of text: no control characters (Cause's rule for its message and manifest).
_ONE_LINE = r"^[^\x00-\x1f\x7f]*$"
_MESSAGE_TEXT = {"type": "string", "maxLength": MAX_MESSAGE, "pattern": _ONE_LINE}
_SAYS = (
    "What the person says of the change, kept in the revision it makes (one line, at most "
    f"{MAX_MESSAGE} characters)"
)
_MESSAGE = {**_MESSAGE_TEXT, "type": ["string", "null"], "description": _SAYS}
#: Who asks, over HTTP: a client of the API, or the CLI through it.
_VIA = {"enum": ["api", "cli"], "description": "Who asks: `api` (the default) or `cli`"}

#: Why each error status comes: the same text wherever the status is documented.
_ERRORS = {
    "400": "The body or a query parameter is malformed (not JSON, empty, nested too deeply, or "
    "a parameter of the wrong type)",
    "401": "No token, or a wrong one",
    "404": "No such backend",
    "404-revision": "No such backend, or it keeps no such revision (UnknownRevision)",
    "409": "Valid, but it cannot be placed on the runtime (beside what runs already), or its "
    "route leads to another backend (RouteConflict); nothing was applied",
    "409-rollout": "Refused as the backend is now, with the reason as the error's type: Paused "
    "(resume it first), Deleting, NoGoodRevision (no earlier revision completed: name one), or "
    "CodeChanged (the entrypoint's source on disk is not the revision's: undo with force); "
    "nothing was written",
    "413": "The body is over 1 MiB",
    "415": "The body is not sent as application/json",
    "422": "The body is JSON but breaks a rule; `problems` lists each, naming the field",
    "501": "This runtime keeps no replica logs the daemon can read (Ray)",
    "503": "The daemon is shutting down and takes no more changes, or the store cannot be "
    "written (then with Retry-After); nothing was applied",
}


#: What a request that writes a body-given change may answer besides 200.
_WRITE_ERRORS = ("400", "409", "413", "415", "422", "503")


def _op(
    summary: str,
    ok: dict[str, Any],
    *errors: str,
    body: str | None = None,
    parameters: list[dict[str, Any]] | None = None,
    description: str | None = None,
    body_required: bool = True,
) -> dict[str, Any]:
    """An operation; each of `errors` is a status (``"409"``), or one with the reason it has
    here (``"409-rollout"``: a key of ``_ERRORS``)."""
    responses = dict(ok)
    for key in ("401", *errors):
        code = key.partition("-")[0]
        response: dict[str, Any] = {
            "description": _ERRORS[key],
            "content": {_JSON_BODY: {"schema": _ref("Error")}},
        }
        if code == "401":
            response["headers"] = {"WWW-Authenticate": {"schema": _STRING, "required": True}}
        if code == "503":
            response["headers"] = {"Retry-After": {"schema": _INT}}
        responses[code] = response
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if description is not None:
        op["description"] = description
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {
            "required": body_required,
            "content": {_JSON_BODY: {"schema": _ref(body)}},
        }
    return op


def _json(code: str, description: str, schema: str) -> dict[str, Any]:
    return {code: {"description": description, "content": {_JSON_BODY: {"schema": _ref(schema)}}}}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": description}


def _flag(name: str, description: str) -> dict[str, Any]:
    # Sent as the words true or false; anything else is a 400.
    return _query(name, _BOOL, description)


_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": f"^{NAME_PATTERN}$"},
    "description": "The backend's name",
}

_BACKEND_FIELDS = field_schemas(BackendConfig)
_BACKEND = {
    **_obj({"entrypoint": field_schemas(ReplicaConfig)["entrypoint"]}),
    "description": "BackendConfig and ReplicaConfig fields side by side (the flat form of a "
    "manifest's table); fields left out take their defaults",
}
_BACKEND["properties"] |= {**_BACKEND_FIELDS, **field_schemas(ReplicaConfig)}
# The one rule that ties two fields: an update could never proceed with both at 0. Written
# without `not` (schemathesis cannot draw from one below the root, as in a manifest): either
# is above 0, and a field left out takes its default, which is.
_BACKEND["anyOf"] = [
    {"properties": {"max_surge": {"exclusiveMinimum": 0}}},
    {"properties": {"max_unavailable": {"exclusiveMinimum": 0}}},
]

_REPLICA = _obj(
    {
        "tag": _STRING,
        "state": {"enum": [s.value for s in ReplicaState]},
        "version": _STRING,
        "address": _NULLABLE_STRING,
        "healthy": _BOOL,
        "pid": {"type": ["integer", "null"]},
        "node": _NULLABLE_STRING,
        "created_at": {"type": ["string", "null"], "format": "date-time"},
        "age_s": {"type": ["number", "null"], "minimum": 0},
    }
)
_COUNTS = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}
_DECISION = {
    "oneOf": [
        {"type": "null"},
        _obj(
            {
                "time": {"type": ["string", "null"], "format": "date-time"},
                "ongoing": {"type": ["number", "null"], "minimum": 0},
                "not_ready": {"type": "integer", "minimum": 0},
                "previous": {"type": "integer", "minimum": 0},
                "recommended": {"type": "integer", "minimum": 0},
                "target": {"type": "integer", "minimum": 0},
                "reason": _STRING,
            }
        ),
    ]
}

_OUTCOMES: tuple[str, ...] = get_args(RevisionOutcome)
#: What a revision's replicas run, in the fields a deploy names them by.
_REVISION_CONFIG = _obj(
    {
        **field_schemas(ReplicaConfig),
        **{key: _BACKEND_FIELDS[key] for key in ("version", "user_config", "resources")},
    }
)

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {
                    "type": _STRING,
                    "message": _STRING,
                    "problems": {"type": "array", "items": _STRING},
                },
            }
        },
    },
    "Backend": _BACKEND,
    "BackendConfig": {
        **_obj(_BACKEND_FIELDS),
        "description": "A backend's BackendConfig, every field present",
    },
    "Apply": _obj(
        {},
        backends={
            "type": "object",
            "propertyNames": {"pattern": f"^{NAME_PATTERN}$"},
            "additionalProperties": _ref("Backend"),
            "description": "The backends of a manifest, by name",
        },
        prune={**_BOOL, "description": "Delete every backend not named here"},
        source={
            **_STRING,
            "maxLength": MAX_MANIFEST,
            "pattern": _ONE_LINE,
            "description": "Where the manifest came from (the CLI sends its file's path): for "
            "messages, and kept as the manifest of the revisions it makes",
        },
        source_digest={
            "type": ["string", "null"],
            "pattern": "^[0-9a-f]{1,128}$",
            "description": "The SHA-256 of the manifest file's bytes, in lowercase hex, kept "
            "beside `source` (two versions of one file tell apart)",
        },
        message=_MESSAGE,
        via=_VIA,
    ),
    "Undo": _obj(
        {},
        to_revision={
            **_NULLABLE_REVISION,
            "maximum": MAX_REVISION,
            "description": "The revision whose content to bring back (see its revisions); "
            "left out or null: the newest that completed with every replica serving",
        },
        force={
            **_BOOL,
            "description": "Undo even if the entrypoint's source on disk is not what the "
            "revision recorded (it would run today's code under the old config)",
        },
        message=_MESSAGE,
        via=_VIA,
    ),
    "RolloutAccepted": _obj(
        {
            "name": _STRING,
            "generation": {
                "type": "integer",
                "minimum": 1,
                "description": "The spec's generation: wait for its goal as after a deploy",
            },
            "revision": {
                **_NULLABLE_REVISION,
                "description": "The revision the backend rolls out, or runs",
            },
            "restores": {
                **_NULLABLE_REVISION,
                "description": "That revision came from an undo: the one it brings back",
            },
            "paused": _BOOL,
            "pending_revision": {
                **_NULLABLE_REVISION,
                "description": "While paused: the revision a resume rolls out",
            },
        }
    ),
    "Rollout": _obj(
        {
            "revision": {
                **_NULLABLE_REVISION,
                "description": "The target: the revision it rolls out, or runs once that is done",
            },
            "current_revision": {
                **_NULLABLE_REVISION,
                "description": "The newest revision whose rollout completed",
            },
            "outcome": {"enum": [*_OUTCOMES, None]},
            "paused": _BOOL,
            "pending_revision": {
                **_NULLABLE_REVISION,
                "description": "While paused: the revision a resume rolls out",
            },
            "error": _NULLABLE_STRING,
            "restores": _NULLABLE_REVISION,
            "automatic": {**_BOOL, "description": "`revision` came from an automatic rollback"},
        }
    ),
    "Cause": _obj(
        {
            "via": {"enum": list(VIA)},
            "message": _NULLABLE_STRING,
            "manifest": _NULLABLE_STRING,
            "manifest_digest": _NULLABLE_STRING,
        }
    ),
    "Revision": _obj(
        {
            "number": _REVISION,
            "version": {
                **_STRING,
                "description": "Its replicas' version (`gen-N` when its config names none)",
            },
            "digest": {**_STRING, "description": "A fingerprint of what its replicas run"},
            "created_at": {"type": ["string", "null"], "format": "date-time"},
            "cause": _ref("Cause"),
            "code": {
                "oneOf": [
                    {"type": "null"},
                    _obj({"module": _STRING, "digest": _STRING, "files": _COUNT}),
                ],
                "description": "The entrypoint module's source when it was made (null: not "
                "found on the controller's path, so not pinned)",
            },
            "code_changed": {
                "type": ["boolean", "null"],
                "description": "The source on disk is not `code` any more (null: cannot tell)",
            },
            "outcome": {"enum": list(_OUTCOMES)},
            "error": _NULLABLE_STRING,
            "good": {
                **_BOOL,
                "description": "It completed with replicas serving: a plain undo may go back to it",
            },
            "restores": {
                **_NULLABLE_REVISION,
                "description": "Made by an undo or a rollback: the revision it brings back",
            },
            "automatic": {**_BOOL, "description": "Made by an automatic rollback"},
            "current": {**_BOOL, "description": "The one the backend rolls out, or runs"},
            "config": _REVISION_CONFIG,
        }
    ),
    "RevisionList": _obj(
        {"name": _STRING, "revisions": {"type": "array", "items": _ref("Revision")}}
    ),
    "Replica": _REPLICA,
    "Event": _obj(
        {"time": {"type": ["string", "null"], "format": "date-time"}, "kind": _STRING}
        | {"message": _STRING}
    ),
    "BackendStatus": _obj(
        {
            "name": _STRING,
            "state": {"enum": [s.value for s in BackendState]},
            "reason": _STRING,
            "message": _STRING,
            "generation": _INT,
            "observed_generation": _INT,
            "deleting": _BOOL,
            "goal_done": _BOOL,
            "last_error": _NULLABLE_STRING,
            "last_traceback": _NULLABLE_STRING,
            "desired": {"type": "integer", "minimum": 0},
            "version": _STRING,
            "ready": {"type": "integer", "minimum": 0},
            "ready_of_version": {"type": "integer", "minimum": 0},
            "config": _ref("Backend"),
            "counts": _COUNTS,
            "counts_by_version": {"type": "object", "additionalProperties": _COUNTS},
            "replicas": {"type": "array", "items": _ref("Replica")},
            "events": {"type": "array", "items": _ref("Event")},
            "load": _ref("BackendLoad"),
            "autoscaler": {
                "oneOf": [{"type": "null"}, _ref("Autoscaler")],
                "description": "Its autoscaler, if it is autoscaled",
            },
            "rollout": {
                "oneOf": [{"type": "null"}, _ref("Rollout")],
                "description": "Its revisions' rollout: the target and the current revision",
            },
        }
    ),
    "Autoscaler": _obj(
        {
            "min_replicas": {"type": "integer", "minimum": 0},
            "max_replicas": {"type": "integer", "minimum": 1},
            "target_ongoing_requests": {"type": "number", "exclusiveMinimum": 0},
            "target": {"type": "integer", "minimum": 0},
            "capped_at": {
                "type": ["integer", "null"],
                "minimum": 0,
                "description": "Set while the runtime fits fewer replicas than the target: "
                "the most that fit, which the backend works toward meanwhile",
            },
            "last": {
                **_DECISION,
                "description": "Its latest evaluation: the load it saw (null: no signal), "
                "what it recommended, what it set, and why",
            },
            "last_change": {
                **_DECISION,
                "description": "Its latest evaluation that changed the count",
            },
        }
    ),
    "BackendLoad": _obj(
        {
            "in_flight": {"type": "integer", "minimum": 0},
            "queued": {"type": "integer", "minimum": 0},
            "replicas": _COUNTS,
            "sources": {"type": "integer", "minimum": 0},
            "self_reported": {"type": "integer", "minimum": 0},
        }
    ),
    "LoadReport": _obj(
        {
            "source": {
                "type": "string",
                "pattern": f"^{SOURCE_PATTERN}$",
                "description": "Who reports (one id per ingress process)",
            },
            "backends": {
                "type": "object",
                "propertyNames": {"pattern": f"^{NAME_PATTERN}$"},
                "maxProperties": MAX_LOAD_BACKENDS,
                "additionalProperties": _obj(
                    {
                        "in_flight": {
                            "type": "object",
                            "maxProperties": MAX_LOAD_REPLICAS,
                            "additionalProperties": {
                                "type": "integer",
                                "minimum": 0,
                                "maximum": MAX_LOAD_COUNT,
                            },
                        },
                        "queued": {"type": "integer", "minimum": 0, "maximum": MAX_LOAD_COUNT},
                    }
                ),
                "description": "Each backend's load: in flight per replica tag, and queued",
            },
        }
    ),
    "LoadTaken": _obj(
        {
            "taken": {"type": "array", "items": _STRING},
            "unknown": {
                "type": "array",
                "items": _STRING,
                "description": "Backends the daemon does not hold (their reports were dropped)",
            },
        }
    ),
    "BackendList": _obj({"backends": {"type": "array", "items": _ref("BackendStatus")}}),
    "Accepted": _obj({"name": _STRING, "generation": {"type": "integer", "minimum": 1}}),
    "Applied": _obj(
        {
            "applied": {
                "type": "array",
                "items": _obj({"name": _STRING, "generation": _INT, "changed": _BOOL}),
            },
            "deleted": {"type": "array", "items": _obj({"name": _STRING, "generation": _INT})},
        }
    ),
    "Snapshot": _obj(
        {
            "name": _STRING,
            "snapshot_id": _INT,
            "exists": _BOOL,
            "deleting": _BOOL,
            "config": {"anyOf": [_ref("BackendConfig"), {"type": "null"}]},
            "replicas": {
                "type": "array",
                "items": _obj({"tag": _STRING, "version": _STRING, "address": _NULLABLE_STRING}),
            },
        }
    ),
    "Watch": _obj(
        {
            "epoch": _STRING,
            "cursor": _INT,
            "complete": {
                **_BOOL,
                "description": "The snapshots are every backend there is: drop any other",
            },
            "snapshots": {"type": "array", "items": _ref("Snapshot")},
        }
    ),
    "Logs": _obj(
        {
            "name": _STRING,
            "exists": _BOOL,
            "logs": {
                "type": "array",
                "items": _obj(
                    {
                        "replica": _STRING,
                        "state": _STRING,
                        "text": _STRING,
                        "offset": {"type": "integer", "minimum": 0},
                    }
                ),
            },
        }
    ),
    "Shutdown": _obj(
        {"shutting_down": {"const": True}, "deleting": {"type": "array", "items": _STRING}},
        left={
            "type": "array",
            "items": _STRING,
            "description": "Backends still there when the daemon stopped waiting",
        },
    ),
    "Health": _obj({"ok": {"const": True}}),
}

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
`POST .../resume`. These answer 202 with a generation to wait for, as a deploy's."""

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "trio-replica-controller", "version": "1", "description": _DESCRIPTION},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": _SCHEMAS,
    },
    "security": [{"bearer": []}],
    "paths": {
        "/healthz": {
            "get": {
                "summary": "Liveness; needs no token",
                "security": [],
                "responses": _json("200", "The daemon answers", "Health"),
            }
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics",
                {
                    "200": {
                        "description": "The text exposition format",
                        "content": {
                            "text/plain; version=0.0.4; charset=utf-8": {"schema": _STRING}
                        },
                    }
                },
            )
        },
        "/openapi.json": {
            "get": _op(
                "This document",
                {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {_JSON_BODY: {"schema": {"type": "object"}}},
                    }
                },
            )
        },
        "/api/v1/backends": {
            "get": _op("Every backend's status", _json("200", "By name", "BackendList"))
        },
        "/api/v1/backends/{name}": {
            "parameters": [_NAME],
            "get": {
                **_op("One backend's status", _json("200", "Its status", "BackendStatus"), "404"),
                "operationId": "getBackend",
            },
            "put": {
                **_op(
                    "Deploy: create or update a backend",
                    _json("200", "Stored; the backend converges from here", "Accepted"),
                    *_WRITE_ERRORS,
                    body="Backend",
                    parameters=[_query("message", _MESSAGE_TEXT, _SAYS)],
                ),
                "operationId": "deployBackend",
            },
            "delete": {
                "operationId": "deleteBackend",
                **_op(
                    "Drain and delete a backend (asynchronous)",
                    _json("202", "Stored; its replicas drain, then it is gone", "Accepted"),
                    "400",
                    "404",
                    "503",
                    parameters=[
                        _flag(
                            "force",
                            "Stop replicas without draining, and cut short drains under way; "
                            "taken even while the daemon shuts down",
                        )
                    ],
                ),
            },
        },
        "/api/v1/backends/{name}/logs": {
            "parameters": [_NAME],
            "get": {
                "operationId": "getLogs",
                **_op(
                    "The logs of a backend's replicas, current and gone",
                    _json("200", "Each replica's log", "Logs"),
                    "400",
                    "404",
                    "501",
                    parameters=[
                        _query("replica", _STRING, "One replica's tag"),
                        _query(
                            "tail",
                            {"type": "integer", "minimum": 0, "maximum": 10_000},
                            "Lines from the end of each log (100 if not given)",
                        ),
                        _query(
                            "offset",
                            _COUNT,
                            "Only what was written after this offset (from an earlier answer)",
                        ),
                    ],
                ),
            },
        },
        "/api/v1/backends/{name}/revisions": {
            "parameters": [_NAME],
            "get": {
                "operationId": "getRevisions",
                **_op(
                    "A backend's revisions, oldest first",
                    _json("200", "Each kept revision, with its cause and outcome", "RevisionList"),
                    "404",
                ),
            },
        },
        "/api/v1/backends/{name}/undo": {
            "parameters": [_NAME],
            "post": {
                "operationId": "undoBackend",
                **_op(
                    "Undo: roll back to an earlier revision's content, as a new revision",
                    _json("202", "Stored; the backend rolls back from here", "RolloutAccepted"),
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
        "/api/v1/backends/{name}/pause": {
            "parameters": [_NAME],
            "post": {
                "operationId": "pauseBackend",
                **_op(
                    "Pause: record later deploys as revisions without rolling them out",
                    _json("202", "Stored (a rollout under way goes on)", "RolloutAccepted"),
                    "404",
                    "409-rollout",
                    "503",
                ),
            },
        },
        "/api/v1/backends/{name}/resume": {
            "parameters": [_NAME],
            "post": {
                "operationId": "resumeBackend",
                **_op(
                    "Resume: roll out what was deployed while paused, and stop pausing",
                    _json("202", "Stored; the pending revision rolls out", "RolloutAccepted"),
                    "404",
                    "409-rollout",
                    "503",
                ),
            },
        },
        "/api/v1/apply": {
            "post": _op(
                "Deploy every backend of a manifest, all or nothing; prune deletes the others",
                _json("200", "Stored", "Applied"),
                *_WRITE_ERRORS,
                body="Apply",
            )
        },
        "/api/v1/load": {
            "post": _op(
                "Report an ingress's load (sent on change, and every 10 s while not zero)",
                _json("200", "Taken", "LoadTaken"),
                "400",
                "413",
                "415",
                "422",
                body="LoadReport",
            )
        },
        "/api/v1/watch": {
            "get": _op(
                "Long poll: the snapshots newer than `since`",
                _json("200", "Snapshots, or none if timeout_s passed first", "Watch"),
                "400",
                parameters=[
                    _query("since", _COUNT, "The cursor of the last answer (0: everything)"),
                    _query("epoch", _STRING, "The epoch of the last answer"),
                    _query(
                        "timeout_s",
                        {"type": "number", "minimum": 0, "maximum": 60},
                        "How long to wait for a change (30 if not given)",
                    ),
                ],
            )
        },
        "/api/v1/shutdown": {
            "post": _op(
                "Drain and delete every backend, then stop the daemon",
                {
                    **_json("200", "Drained (`left`: what was not)", "Shutdown"),
                    **_json("202", "Started (with wait=false)", "Shutdown"),
                },
                "400",
                "503",
                parameters=[_flag("wait", "Answer once the drains are over (true by default)")],
            )
        },
    },
}

# Stateful runs (and client generators) follow a deploy to what can be done with its backend.
_deployed = OPENAPI["paths"]["/api/v1/backends/{name}"]["put"]["responses"]["200"]
_deployed["links"] = {
    op: {"operationId": op, "parameters": {"name": "$response.body#/name"}}
    for op in (
        "getBackend",
        "deleteBackend",
        "getLogs",
        "getRevisions",
        "undoBackend",
        "pauseBackend",
        "resumeBackend",
    )
}
