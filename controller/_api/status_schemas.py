"""The schemas of a backend's status (its replicas, events, load and autoscaler), written as
the views (``views``) make them."""

from __future__ import annotations

from typing import Any

from .._model.records.replica_state import ReplicaState
from .._model.views.status import BackendState
from .schema_parts import BOOL, INT, NULLABLE_STRING, STRING, obj, ref

_REPLICA = obj(
    {
        "tag": STRING,
        "state": {"enum": [s.value for s in ReplicaState]},
        "version": STRING,
        "address": NULLABLE_STRING,
        "healthy": BOOL,
        "pid": {"type": ["integer", "null"]},
        "node": NULLABLE_STRING,
        "created_at": {"type": ["string", "null"], "format": "date-time"},
        "age_s": {"type": ["number", "null"], "minimum": 0},
    }
)
_COUNTS = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}
_DECISION = {
    "oneOf": [
        {"type": "null"},
        obj(
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

STATUS_SCHEMAS: dict[str, Any] = {
    "Replica": _REPLICA,
    "FailedStart": obj(
        {
            "replica": {**STRING, "description": "Its tag: the logs endpoint's `replica`"},
            "version": STRING,
            "time": {"type": ["string", "null"], "format": "date-time"},
            "error": {**STRING, "description": "As `last_error` says it: `Type: message`"},
            "error_type": {
                **NULLABLE_STRING,
                "description": "The exception's name; null if the error names none",
            },
            "message": STRING,
            "traceback": {
                **NULLABLE_STRING,
                "description": "The replica's own, where its runtime reported one",
            },
        }
    ),
    "Event": obj(
        {"time": {"type": ["string", "null"], "format": "date-time"}, "kind": STRING}
        | {"message": STRING}
    ),
    "BackendStatus": obj(
        {
            "name": STRING,
            "state": {"enum": [s.value for s in BackendState]},
            "reason": STRING,
            "message": STRING,
            "generation": INT,
            "observed_generation": INT,
            "deleting": BOOL,
            "goal_done": BOOL,
            "last_error": {
                **NULLABLE_STRING,
                "description": "The latest replica failure, until the backend is healthy again",
            },
            "last_traceback": NULLABLE_STRING,
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
        code_changed={
            "type": ["boolean", "null"],
            "description": "Only in a single backend's status: the source on disk of the "
            "revision it runs (or rolls out) is not what that revision recorded, so edited code "
            "waits for `POST .../restart` (null: cannot tell)",
        },
        failed_starts={
            "type": "array",
            "items": ref("FailedStart"),
            "description": "Its latest failed starts, oldest first, until it is healthy "
            "again; left out of a listing with view=summary",
        },
    ),
    "Autoscaler": obj(
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
    "BackendLoad": obj(
        {
            "in_flight": {"type": "integer", "minimum": 0},
            "queued": {"type": "integer", "minimum": 0},
            "replicas": _COUNTS,
            "sources": {"type": "integer", "minimum": 0},
            "self_reported": {"type": "integer", "minimum": 0},
            "served": {
                **_COUNTS,
                "description": "Requests each replica has answered, by its own count (code "
                "the worker serves)",
            },
            "models": {
                "type": "object",
                "additionalProperties": ref("ReplicaModels"),
                "description": "What each multiplexed replica holds, by its own word "
                "(@controller.multiplexed)",
            },
            "batches": {
                "type": "object",
                "additionalProperties": {"type": "array", "items": ref("BatchNumbers")},
                "description": "Each replica's batched functions (@controller.batch), by its "
                "own count",
            },
        }
    ),
    "BatchNumbers": obj(
        {
            "function": {**STRING, "description": "The batched function's qualified name"},
            "batches": INT,
            "items": {**INT, "description": "Items in all its batches (/ batches: mean size)"},
            "largest": INT,
            "waited_s": {
                "type": "number",
                "minimum": 0,
                "description": "Its batches' waits, each from its first item's arrival to its "
                "run, summed (/ batches: mean wait)",
            },
        }
    ),
    "ReplicaModels": obj(
        {
            "generation": {**INT, "description": "Counts each change of its models"},
            "capacity": {**INT, "description": "Its max_models_per_replica"},
            "models": {
                "type": "array",
                "items": STRING,
                "description": "What it holds, and is loading",
            },
            "requests": {**_COUNTS, "description": "Requests that named each model"},
            "hits": {**INT, "description": "Loads asked of a model it held"},
            "misses": {**INT, "description": "Loads asked of a model it did not hold"},
            "loads": INT,
            "evictions": INT,
        }
    ),
}
