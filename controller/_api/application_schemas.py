"""The applications' part of the OpenAPI document: their paths and schemas, written as
``applications`` answers."""

from __future__ import annotations

from typing import Any

from .._model.config.canary import canary_schema
from .operations import NAME, answer, flag, operation
from .schema_parts import BOOL, COUNT, STRING, obj, ref

_NULLABLE_REVISION = {"type": ["integer", "null"], "minimum": 0}
_APP = {**NAME, "description": "The application's name"}

SCHEMAS: dict[str, Any] = {
    "ApplicationDecl": obj(
        {"entry": {**STRING, "description": "The member requests enter by (a backend named here)"}},
        backends={
            "type": "array",
            "items": STRING,
            "description": "The other members: backends of the same apply",
        },
        canary={
            **canary_schema(),
            "description": "The canary block of every member that sets none of its own",
        },
    ),
    "ApplicationMember": obj(
        {
            "name": STRING,
            "entry": BOOL,
            "state": STRING,
            "message": STRING,
            "revision": _NULLABLE_REVISION,
            "recorded": _NULLABLE_REVISION,
        }
    ),
    "Application": obj(
        {
            "name": STRING,
            "entry": STRING,
            "revision": _NULLABLE_REVISION,
            "state": STRING,
            "members": {"type": "array", "items": ref("ApplicationMember")},
        }
    ),
    "ApplicationList": obj(
        {"applications": {"type": "array", "items": ref("Application")}},
    ),
    "ApplicationRevision": obj(
        {
            "number": {"type": "integer", "minimum": 1},
            "members": {"type": "object", "additionalProperties": COUNT},
            "created_at": {"type": ["string", "null"]},
            "undone_to": {"type": ["integer", "null"], "minimum": 1},
            "restart": {**BOOL, "description": "Made by a restart of every member"},
            "restorable": {
                **BOOL,
                "description": "Every member still keeps the backend revision it names (an "
                "undo to it can be done)",
            },
            "cause": ref("Cause"),
            "current": BOOL,
        }
    ),
    "ApplicationRevisions": obj(
        {"name": STRING, "revisions": {"type": "array", "items": ref("ApplicationRevision")}}
    ),
    "ApplicationDeleted": obj(
        {"name": STRING, "generations": {"type": "object", "additionalProperties": COUNT}}
    ),
}

_NOT_FOUND = "404-application"
_STEERS = {
    "undo": (
        "Undo every member to what an earlier application revision recorded, in one change",
        "Undo",
        "Without a body: the revision before the latest. Each member rolls back as its own "
        "undo would; one member that refuses (paused, deleting, its code changed, its revision "
        "no longer kept) refuses the whole undo, and nothing is written.",
    ),
    "restart": ("Restart every member (a rolling update each), in one change", "Restart", None),
    "promote": ("Promote the canary of every member in one", "Steer", None),
    "abort": ("Abort the canary of every member in one", "Steer", None),
}

PATHS: dict[str, Any] = {
    "/api/v1/applications": {
        "get": operation(
            "Every application: its entry, members, latest revision and state",
            answer("200", "The applications, by name", "ApplicationList"),
        )
    },
    "/api/v1/applications/{name}": {
        "parameters": [_APP],
        "get": operation(
            "An application as a unit with its members",
            answer("200", "The application", "Application"),
            _NOT_FOUND,
        ),
        "delete": operation(
            "Delete an application: every member and its record, in one change",
            answer("202", "Stored; the members drain and go", "ApplicationDeleted"),
            _NOT_FOUND,
            "400",
            "503",
            parameters=[flag("force", "Skip the graceful drain of every member")],
        ),
    },
    "/api/v1/applications/{name}/revisions": {
        "parameters": [_APP],
        "get": operation(
            "An application's revisions, oldest first: each member's backend revision",
            answer("200", "Each kept revision", "ApplicationRevisions"),
            _NOT_FOUND,
        ),
    },
    **{
        f"/api/v1/applications/{{name}}/{what}": {
            "parameters": [_APP],
            "post": operation(
                summary,
                answer("202", "Stored; the members roll out from here", "Application"),
                "400",
                _NOT_FOUND,
                "409-rollout",
                "413",
                "415",
                "422",
                "503",
                body=body,
                body_required=False,
                description=description,
            ),
        }
        for what, (summary, body, description) in _STEERS.items()
    },
}
