"""The schemas of the OpenAPI description (``openapi``): the request bodies, made from the
config model itself, and the answers, written as the views (``views``) make them."""

from __future__ import annotations

from typing import Any, get_args

from .._model.config import MAX_REPLICAS, NAME_PATTERN, BackendConfig, ReplicaConfig, field_schemas
from .._model.load_report import (
    MAX_LOAD_BACKENDS,
    MAX_LOAD_COUNT,
    MAX_LOAD_REPLICAS,
    SOURCE_PATTERN,
)
from .._model.records import MAX_REVISION
from .._model.revisions import MAX_MANIFEST, MAX_MESSAGE, VIA, RevisionOutcome
from .._model.status import BackendState, ReplicaState


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    """An object with exactly these properties (those in `required` always present)."""
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **optional},
        "additionalProperties": False,
    }


STRING = {"type": "string"}
INT = {"type": "integer"}
COUNT = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
BOOL = {"type": "boolean"}
_NULLABLE_STRING = {"type": ["string", "null"]}
JSON_BODY = "application/json"
#: The largest revision number a request may name (a signed 64-bit integer's, as for counts in
#: a query): a larger one is a mistake, refused as such rather than looked for.
_REVISION = {"type": "integer", "minimum": 1}
_NULLABLE_REVISION = {"type": ["integer", "null"], "minimum": 1}
#: One line of text: no control characters (Cause's rule for its message and manifest).
_ONE_LINE = r"^[^\x00-\x1f\x7f]*$"
MESSAGE_TEXT = {"type": "string", "maxLength": MAX_MESSAGE, "pattern": _ONE_LINE}
SAYS = (
    "What the person says of the change, kept in the revision it makes (one line, at most "
    f"{MAX_MESSAGE} characters)"
)
_MESSAGE = {**MESSAGE_TEXT, "type": ["string", "null"], "description": SAYS}
#: Who asks, over HTTP: a client of the API, or the CLI through it.
_VIA = {"enum": ["api", "cli"], "description": "Who asks: `api` (the default) or `cli`"}

#: Why each error status comes: the same text wherever the status is documented.
#: What a request that writes a body-given change may answer besides 200.
NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": f"^{NAME_PATTERN}$"},
    "description": "The backend's name",
}

_BACKEND_FIELDS = field_schemas(BackendConfig)
_REPLICA_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_REPLICAS}
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
        "tag": STRING,
        "state": {"enum": [s.value for s in ReplicaState]},
        "version": STRING,
        "address": _NULLABLE_STRING,
        "healthy": BOOL,
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
                "reason": STRING,
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

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {
                    "type": STRING,
                    "message": STRING,
                    "problems": {"type": "array", "items": STRING},
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
            "additionalProperties": ref("Backend"),
            "description": "The backends of a manifest, by name",
        },
        prune={**BOOL, "description": "Delete every backend not named here"},
        source={
            **STRING,
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
            **BOOL,
            "description": "Undo even if the entrypoint's source on disk is not what the "
            "revision recorded (it would run today's code under the old config)",
        },
        message=_MESSAGE,
        via=_VIA,
    ),
    "RolloutAccepted": _obj(
        {
            "name": STRING,
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
            "paused": BOOL,
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
            "paused": BOOL,
            "pending_revision": {
                **_NULLABLE_REVISION,
                "description": "While paused: the revision a resume rolls out",
            },
            "error": _NULLABLE_STRING,
            "restores": _NULLABLE_REVISION,
            "automatic": {**BOOL, "description": "`revision` came from an automatic rollback"},
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
                **STRING,
                "description": "Its replicas' version (`gen-N` when its config names none)",
            },
            "digest": {**STRING, "description": "A fingerprint of what its replicas run"},
            "created_at": {"type": ["string", "null"], "format": "date-time"},
            "cause": ref("Cause"),
            "code": {
                "oneOf": [
                    {"type": "null"},
                    _obj({"module": STRING, "digest": STRING, "files": COUNT}),
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
                **BOOL,
                "description": "It completed with replicas serving: a plain undo may go back to it",
            },
            "restores": {
                **_NULLABLE_REVISION,
                "description": "Made by an undo or a rollback: the revision it brings back",
            },
            "automatic": {**BOOL, "description": "Made by an automatic rollback"},
            "current": {**BOOL, "description": "The one the backend rolls out, or runs"},
            "config": _REVISION_CONFIG,
        }
    ),
    "RevisionList": _obj(
        {"name": STRING, "revisions": {"type": "array", "items": ref("Revision")}}
    ),
    "Replica": _REPLICA,
    "Event": _obj(
        {"time": {"type": ["string", "null"], "format": "date-time"}, "kind": STRING}
        | {"message": STRING}
    ),
    "BackendStatus": _obj(
        {
            "name": STRING,
            "state": {"enum": [s.value for s in BackendState]},
            "reason": STRING,
            "message": STRING,
            "generation": INT,
            "observed_generation": INT,
            "deleting": BOOL,
            "goal_done": BOOL,
            "last_error": _NULLABLE_STRING,
            "last_traceback": _NULLABLE_STRING,
            "desired": {"type": "integer", "minimum": 0},
            "version": STRING,
            "ready": {"type": "integer", "minimum": 0},
            "ready_of_version": {"type": "integer", "minimum": 0},
            "config": ref("Backend"),
            "counts": _COUNTS,
            "counts_by_version": {"type": "object", "additionalProperties": _COUNTS},
            "load": ref("BackendLoad"),
            "autoscaler": {
                "oneOf": [{"type": "null"}, ref("Autoscaler")],
                "description": "Its autoscaler, if it is autoscaled",
            },
            "rollout": {
                "oneOf": [{"type": "null"}, ref("Rollout")],
                "description": "Its revisions' rollout: the target and the current revision",
            },
        },
        replicas={
            "type": "array",
            "items": ref("Replica"),
            "description": "Left out of a listing with view=summary",
        },
        events={
            "type": "array",
            "items": ref("Event"),
            "description": "Left out of a listing with view=summary",
        },
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
    "Ingress": _obj(
        {
            "listen": {
                "type": ["string", "null"],
                "description": "HOST:PORT the ingress processes serve (null: no ingress)",
            },
            "workers": {"type": "integer", "minimum": 0},
            "processes": {
                "type": "array",
                "items": _obj(
                    {
                        "slot": {"type": "integer", "minimum": 0},
                        "pid": {"type": ["integer", "null"]},
                        "state": {"enum": ["starting", "serving", "restarting", "stopping"]},
                        "since": {
                            "type": ["string", "null"],
                            "description": "When it entered its state (ISO 8601, UTC)",
                        },
                        "restarts": {"type": "integer", "minimum": 0},
                        "last_exit": _NULLABLE_STRING,
                        "adopted": {
                            "type": "boolean",
                            "description": "Started by an earlier daemon on this state dir",
                        },
                        "answers": {
                            "type": "boolean",
                            "description": "It answered the daemon's health check just now",
                        },
                        "following": {
                            "type": "boolean",
                            "description": "It follows the daemon's watch",
                        },
                    }
                ),
            },
        }
    ),
    "LoadTaken": _obj(
        {
            "taken": {"type": "array", "items": STRING},
            "unknown": {
                "type": "array",
                "items": STRING,
                "description": "Backends the daemon does not hold (their reports were dropped)",
            },
        }
    ),
    "BackendList": _obj(
        {"backends": {"type": "array", "items": ref("BackendStatus")}},
        leadership=ref("Leadership"),
        next={
            "type": ["string", "null"],
            "description": "With limit: the `after` of the next page (null: this is the last)",
        },
    ),
    "Leadership": _obj(
        {
            "role": {
                "enum": ["leader", "standby"],
                "description": "This daemon's role: it leads (acts), or stands by (reads)",
            },
            "holder": STRING,
        },
        epoch={"type": "integer", "minimum": 0, "description": "The lease's epoch, as seen"},
        leader={
            "type": ["string", "null"],
            "description": "Who leads (host:state dir); null while none does",
        },
        address={"type": ["string", "null"], "description": "The leader's API"},
        pid={"type": ["integer", "null"]},
        since={
            "type": ["string", "null"],
            "description": "When the leader began to lead (ISO 8601, UTC)",
        },
        renewed={
            "type": ["string", "null"],
            "description": "When the leader last renewed the lease (ISO 8601, UTC)",
        },
    ),
    "Accepted": _obj({"name": STRING, "generation": {"type": "integer", "minimum": 1}}),
    "Applied": _obj(
        {
            "applied": {
                "type": "array",
                "items": _obj({"name": STRING, "generation": INT, "changed": BOOL}),
            },
            "deleted": {"type": "array", "items": _obj({"name": STRING, "generation": INT})},
        }
    ),
    "Snapshot": _obj(
        {
            "name": STRING,
            "snapshot_id": INT,
            "exists": BOOL,
            "deleting": BOOL,
            "config": {"anyOf": [ref("BackendConfig"), {"type": "null"}]},
            "replicas": {
                "type": "array",
                "items": _obj({"tag": STRING, "version": STRING, "address": _NULLABLE_STRING}),
            },
        }
    ),
    "Watch": _obj(
        {
            "epoch": STRING,
            "cursor": INT,
            "complete": {
                **BOOL,
                "description": "The snapshots are every backend there is: drop any other",
            },
            "snapshots": {"type": "array", "items": ref("Snapshot")},
        }
    ),
    "Changes": _obj(
        {
            "epoch": STRING,
            "cursor": {
                **COUNT,
                "description": "Grows with every pass of any backend's loop: send it back as "
                "`since` to wait for the next",
            },
        }
    ),
    "History": _obj(
        {
            "name": STRING,
            "window_s": {"type": "number", "description": "How far back the points go"},
            "points": {
                "type": "array",
                "description": "Oldest first, one whenever a number changed (at most one per "
                "5 s); each value holds until the next point",
                "items": _obj(
                    {
                        "time": {**STRING, "description": "ISO 8601, UTC"},
                        "desired": COUNT,
                        "ready": COUNT,
                        "in_flight": COUNT,
                        "queued": COUNT,
                    }
                ),
            },
        }
    ),
    "Scale": {
        **_obj(
            {},
            replicas={
                **_REPLICA_COUNT,
                "description": "How many replicas a backend without autoscaling runs",
            },
            min_replicas={**_REPLICA_COUNT, "description": "An autoscaled backend's lower bound"},
            max_replicas={**_REPLICA_COUNT, "description": "An autoscaled backend's upper bound"},
            message=_MESSAGE,
        ),
        "anyOf": [
            {"required": ["replicas"]},
            {"required": ["min_replicas"]},
            {"required": ["max_replicas"]},
        ],
    },
    "LoginLink": _obj(
        {
            "code": {**STRING, "description": "Good for one login, within a minute"},
            "path": {**STRING, "description": "The console's login page, the code in its fragment"},
        }
    ),
    "Logs": _obj(
        {
            "name": STRING,
            "exists": BOOL,
            "logs": {
                "type": "array",
                "items": _obj(
                    {
                        "replica": STRING,
                        "state": STRING,
                        "text": STRING,
                        "offset": {"type": "integer", "minimum": 0},
                    }
                ),
            },
        }
    ),
    "Shutdown": _obj(
        {"shutting_down": {"const": True}, "deleting": {"type": "array", "items": STRING}},
        left={
            "type": "array",
            "items": STRING,
            "description": "Backends still there when the daemon stopped waiting",
        },
    ),
    "Health": _obj({"ok": {"const": True}}),
}
