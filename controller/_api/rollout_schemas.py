"""The schemas of a backend's revisions and rollout (``GET .../revisions``, the ``rollout`` of
a status, undo, pause and resume), written as the views (``views``) make them."""

from __future__ import annotations

from typing import Any, get_args

from .._model.config.cause import VIA
from .._model.config.config import BackendConfig
from .._model.config.replica_config import ReplicaConfig
from .._model.records.records import MAX_REVISION
from .._model.records.revisions import RevisionOutcome
from .._model.values.fields import field_schemas
from .schema_parts import (
    BOOL,
    COUNT,
    MESSAGE,
    NULLABLE_STRING,
    SAME_VERSION,
    STRING,
    VIA_HTTP,
    obj,
    ref,
)

#: The largest revision number a request may name (a signed 64-bit integer's, as for counts in
#: a query): a larger one is a mistake, refused as such rather than looked for.
_REVISION = {"type": "integer", "minimum": 1}
_NULLABLE_REVISION = {"type": ["integer", "null"], "minimum": 1}

_BACKEND_FIELDS = field_schemas(BackendConfig)
_OUTCOMES: tuple[str, ...] = get_args(RevisionOutcome)
#: What a revision's replicas run, in the fields a deploy names them by.
_REVISION_CONFIG = obj(
    {
        **field_schemas(ReplicaConfig),
        **{key: _BACKEND_FIELDS[key] for key in ("version", "user_config", "resources")},
    }
)

ROLLOUT_SCHEMAS: dict[str, Any] = {
    "Undo": obj(
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
        message=MESSAGE,
        via=VIA_HTTP,
    ),
    "Restart": obj({}, message=MESSAGE, via=VIA_HTTP),
    "Steer": obj({}, via=VIA_HTTP),
    "RolloutAccepted": obj(
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
    "Rollout": obj(
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
            "error": NULLABLE_STRING,
            "restores": _NULLABLE_REVISION,
            "automatic": {**BOOL, "description": "`revision` came from an automatic rollback"},
            "canary": {
                "oneOf": [{"type": "null"}, ref("Canary")],
                "description": "`revision`'s canary release, while under way or just ended",
            },
        }
    ),
    "Canary": obj(
        {
            "revision": _REVISION,
            "stable_revision": {**_REVISION, "description": "What it is judged against"},
            "phase": {"enum": ["starting", "judging", "held", "promoted", "aborted"]},
            "step": {"type": "integer", "minimum": 1},
            "steps": {"type": "integer", "minimum": 1},
            "weight": {"type": "number", "minimum": 0, "maximum": 100},
            "pause_s": {"type": "number", "minimum": 0},
            "elapsed_s": {"type": ["number", "null"], "minimum": 0},
            "step_started": {
                "type": ["string", "null"],
                "format": "date-time",
                "description": "When the step's clock started (null while its replicas start)",
            },
            "canary": ref("RevisionNumbers"),
            "stable": ref("RevisionNumbers"),
            "verdict": {**STRING, "description": "What the gates say of the step so far"},
            "gates": {**STRING, "description": "The gates, in words"},
        }
    ),
    "RevisionNumbers": obj(
        {
            "version": STRING,
            "requests": COUNT,
            "errors": COUNT,
            "error_rate": {"type": "number", "minimum": 0, "maximum": 1},
            "p99_s": {"type": ["number", "null"], "minimum": 0},
        }
    ),
    "Cause": obj(
        {
            "via": {"enum": list(VIA)},
            "message": NULLABLE_STRING,
            "manifest": NULLABLE_STRING,
            "manifest_digest": NULLABLE_STRING,
        }
    ),
    "Revision": obj(
        {
            "number": _REVISION,
            "version": {
                **STRING,
                "description": "Its replicas' version (`gen-N` when its config names none; "
                "`<version>+restart.N` after a restart)",
            },
            "digest": {**STRING, "description": "A fingerprint of what its replicas run"},
            "created_at": {"type": ["string", "null"], "format": "date-time"},
            "cause": ref("Cause"),
            "code": {
                "oneOf": [
                    {"type": "null"},
                    obj({"module": STRING, "digest": STRING, "files": COUNT}),
                ],
                "description": "The entrypoint module's source when it was made (null: not "
                "found on the controller's path, so not pinned)",
            },
            "code_changed": {
                "type": ["boolean", "null"],
                "description": "The source on disk is not `code` any more (null: cannot tell)",
            },
            "same_version": SAME_VERSION,
            "outcome": {"enum": list(_OUTCOMES)},
            "error": NULLABLE_STRING,
            "good": {
                **BOOL,
                "description": "It completed with replicas serving: a plain undo may go back to it",
            },
            "restores": {
                **_NULLABLE_REVISION,
                "description": "Made by an undo or a rollback: the revision it brings back",
            },
            "restarts": {
                **_NULLABLE_REVISION,
                "description": "Made by a restart: the revision whose content it runs again, "
                "with the code on disk then",
            },
            "automatic": {**BOOL, "description": "Made by an automatic rollback"},
            "canary_of": {
                **_NULLABLE_REVISION,
                "description": "Rolled out as a canary against this revision",
            },
            "canary_skipped": {
                **NULLABLE_STRING,
                "description": "Why a backend with a canary block rolled it out without one",
            },
            "current": {**BOOL, "description": "The one the backend rolls out, or runs"},
            "config": _REVISION_CONFIG,
        }
    ),
    "RevisionList": obj({"name": STRING, "revisions": {"type": "array", "items": ref("Revision")}}),
}
