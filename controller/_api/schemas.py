"""The schemas of the OpenAPI description (``openapi``): the request bodies, made from the
config model itself, and the answers, written as the views (``views``) make them. A backend's
status and its revisions have modules of their own (``status_schemas``, ``rollout_schemas``)."""

from __future__ import annotations

from typing import Any

from .._model.config.cause import MAX_MANIFEST
from .._model.config.config import MAX_REPLICAS, NAME_PATTERN, BackendConfig
from .._model.config.replica_config import ReplicaConfig
from .._model.values.fields import field_schemas
from .._model.views.load_report import (
    MAX_LOAD_BACKENDS,
    MAX_LOAD_COUNT,
    MAX_LOAD_REPLICAS,
    MAX_TRAFFIC_VERSIONS,
    SOURCE_PATTERN,
)
from .application_schemas import SCHEMAS as APPLICATION_SCHEMAS
from .nodes import SCHEMAS as NODE_SCHEMAS
from .rollout_schemas import ROLLOUT_SCHEMAS
from .schema_parts import (
    BOOL,
    COUNT,
    INT,
    MESSAGE,
    NULLABLE_STRING,
    ONE_LINE,
    SAME_VERSION,
    STRING,
    VIA_HTTP,
    obj,
    ref,
)
from .status_schemas import STATUS_SCHEMAS

#: A count in a canary's numbers (what a double holds exactly, as JSON readers keep it).
_TALLY_COUNT = {"type": "integer", "minimum": 0, "maximum": 2**53 - 1}

_BACKEND_FIELDS = field_schemas(BackendConfig)
_REPLICA_COUNT = {"type": "integer", "minimum": 0, "maximum": MAX_REPLICAS}
_BACKEND = {
    **obj({"entrypoint": field_schemas(ReplicaConfig)["entrypoint"]}),
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
        **obj(_BACKEND_FIELDS),
        "description": "A backend's BackendConfig, every field present",
    },
    "Apply": obj(
        {},
        backends={
            "type": "object",
            "propertyNames": {"pattern": f"^{NAME_PATTERN}$"},
            "additionalProperties": ref("Backend"),
            "description": "The backends of a manifest, by name",
        },
        applications={
            "type": "object",
            "propertyNames": {"pattern": f"^{NAME_PATTERN}$"},
            "additionalProperties": ref("ApplicationDecl"),
            "description": "Applications grouping backends of `backends`, by name",
        },
        prune={
            **BOOL,
            "description": "Delete every backend (and application) not named here",
        },
        source={
            **STRING,
            "maxLength": MAX_MANIFEST,
            "pattern": ONE_LINE,
            "description": "Where the manifest came from (the CLI sends its file's path): for "
            "messages, and kept as the manifest of the revisions it makes",
        },
        source_digest={
            "type": ["string", "null"],
            "pattern": "^[0-9a-f]{1,128}$",
            "description": "The SHA-256 of the manifest file's bytes, in lowercase hex, kept "
            "beside `source` (two versions of one file tell apart)",
        },
        message=MESSAGE,
        via=VIA_HTTP,
    ),
    **ROLLOUT_SCHEMAS,
    **STATUS_SCHEMAS,
    **NODE_SCHEMAS,
    **APPLICATION_SCHEMAS,
    "LoadReport": obj(
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
                "additionalProperties": obj(
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
                    },
                    traffic={
                        "type": "object",
                        "maxProperties": MAX_TRAFFIC_VERSIONS,
                        "propertyNames": {"pattern": "^[\\x20-\\x7e]{1,240}$"},
                        "additionalProperties": obj(
                            {
                                "requests": _TALLY_COUNT,
                                "errors": _TALLY_COUNT,
                                "buckets": {
                                    "type": "object",
                                    "propertyNames": {"pattern": "^(?:[0-9]|[1-7][0-9]|80)$"},
                                    "additionalProperties": _TALLY_COUNT,
                                },
                            }
                        ),
                        "description": "During a canary release: what was answered since the "
                        "last report, by replica version; beyond what JSON Schema can say, "
                        "errors are at most requests and the buckets count every request once "
                        "(422 otherwise)",
                    },
                ),
                "description": "Each backend's load: in flight per replica tag, and queued",
            },
        }
    ),
    "Ingress": obj(
        {
            "listen": {
                "type": ["string", "null"],
                "description": "HOST:PORT the ingress processes serve (null: no ingress)",
            },
            "workers": {"type": "integer", "minimum": 0},
            "processes": {
                "type": "array",
                "items": obj(
                    {
                        "slot": {"type": "integer", "minimum": 0},
                        "pid": {"type": ["integer", "null"]},
                        "state": {"enum": ["starting", "serving", "restarting", "stopping"]},
                        "since": {
                            "type": ["string", "null"],
                            "description": "When it entered its state (ISO 8601, UTC)",
                        },
                        "restarts": {"type": "integer", "minimum": 0},
                        "last_exit": NULLABLE_STRING,
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
        },
        nodes={
            "type": "array",
            "description": "With --node-ingress on Ray: the ingress on each node that needs one",
            "items": ref("NodeIngress"),
        },
    ),
    "LoadTaken": obj(
        {
            "taken": {"type": "array", "items": STRING},
            "unknown": {
                "type": "array",
                "items": STRING,
                "description": "Backends the daemon does not hold (their reports were dropped)",
            },
        }
    ),
    "BackendList": obj(
        {"backends": {"type": "array", "items": ref("BackendStatus")}},
        leadership=ref("Leadership"),
        next={
            "type": ["string", "null"],
            "description": "With limit: the `after` of the next page (null: this is the last)",
        },
    ),
    "Leadership": obj(
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
    "Accepted": obj({"name": STRING, "generation": {"type": "integer", "minimum": 1}}),
    "Applied": obj(
        {
            "applied": {
                "type": "array",
                "items": obj(
                    {
                        "name": STRING,
                        "generation": INT,
                        "changed": BOOL,
                        "code_changed": {
                            "type": ["boolean", "null"],
                            "description": "The source on disk is not what the revision it "
                            "runs recorded: edited code waits for `POST .../restart` (null: "
                            "cannot tell)",
                        },
                        "same_version": SAME_VERSION,
                    }
                ),
            },
            "deleted": {"type": "array", "items": obj({"name": STRING, "generation": INT})},
        },
        applications={
            "type": "array",
            "items": obj({"name": STRING, "revision": {"type": ["integer", "null"]}}),
            "description": "The applications the manifest declares, each at its latest revision",
        },
    ),
    "ApplyDiff": obj(
        {
            "backends": {
                "type": "array",
                "items": obj(
                    {
                        "name": STRING,
                        "action": {"enum": ["created", "changed", "unchanged", "deleted"]},
                        "fields": {
                            "type": "object",
                            "additionalProperties": obj({"now": {}, "then": {}}),
                            "description": "Each field that would change: its value now "
                            "(null for a new backend) and then",
                        },
                        "same_version": SAME_VERSION,
                    }
                ),
            }
        }
    ),
    "Snapshot": obj(
        {
            "name": STRING,
            "snapshot_id": INT,
            "exists": BOOL,
            "deleting": BOOL,
            "config": {"anyOf": [ref("BackendConfig"), {"type": "null"}]},
            "replicas": {
                "type": "array",
                "items": obj({"tag": STRING, "version": STRING, "address": NULLABLE_STRING}),
            },
            "traffic": {
                "oneOf": [
                    {"type": "null"},
                    obj(
                        {
                            "canary_version": STRING,
                            "stable_version": STRING,
                            "weight": {"type": "number", "minimum": 0, "maximum": 100},
                        }
                    ),
                ],
                "description": "A canary release's split: the canary's percent of requests",
            },
            "version": {
                **STRING,
                "description": "The version its replicas move to: in a rolling update, the "
                "replicas of it are the new ones (empty once deleted)",
            },
            "held": {
                "type": "object",
                "additionalProperties": STRING,
                "description": "What each multiplexed replica that serves holds, by its latest "
                "load report: '<generation> <capacity> <model> ...', as its answers' "
                "x-replica-models header says it",
            },
        }
    ),
    "Watch": obj(
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
    "Changes": obj(
        {
            "epoch": STRING,
            "cursor": {
                **COUNT,
                "description": "Grows with every pass of any backend's loop: send it back as "
                "`since` to wait for the next",
            },
        }
    ),
    "History": obj(
        {
            "name": STRING,
            "window_s": {"type": "number", "description": "How far back the points go"},
            "points": {
                "type": "array",
                "description": "Oldest first, one whenever a number changed (at most one per "
                "5 s); each value holds until the next point",
                "items": obj(
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
        **obj(
            {},
            replicas={
                **_REPLICA_COUNT,
                "type": ["integer", "null"],
                "description": "How many replicas a backend without autoscaling runs",
            },
            min_replicas={
                **_REPLICA_COUNT,
                "type": ["integer", "null"],
                "description": "An autoscaled backend's lower bound",
            },
            max_replicas={
                **_REPLICA_COUNT,
                "type": ["integer", "null"],
                "minimum": 1,
                "description": "An autoscaled backend's upper bound (at least 1)",
            },
            message=MESSAGE,
        ),
        # null is a count left out (the console sends an emptied field so).
        "anyOf": [
            {"required": ["replicas"]},
            {"required": ["min_replicas"]},
            {"required": ["max_replicas"]},
        ],
    },
    "LoginLink": obj(
        {
            "code": {**STRING, "description": "Good for one login, within a minute"},
            "path": {**STRING, "description": "The console's login page, the code in its fragment"},
        }
    ),
    "Logs": obj(
        {
            "name": STRING,
            "exists": BOOL,
            "logs": {
                "type": "array",
                "items": obj(
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
    "Shutdown": obj(
        {"shutting_down": {"const": True}, "deleting": {"type": "array", "items": STRING}},
        left={
            "type": "array",
            "items": STRING,
            "description": "Backends still there when the daemon stopped waiting",
        },
    ),
    "Health": obj({"ok": {"const": True}}),
}
