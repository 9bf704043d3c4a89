"""How one operation of the OpenAPI description (``openapi``) is written: its answers, the
reason each error status has, its parameters. One text for a status wherever it is documented."""

from __future__ import annotations

from typing import Any

from .._model.config.config import NAME_PATTERN
from .schema_parts import BOOL, COUNT, INT, STRING, ref

JSON_BODY = "application/json"
NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": f"^{NAME_PATTERN}$"},
    "description": "The backend's name",
}

#: Why each error status comes: the same text wherever the status is documented.
_ERRORS = {
    "400": "The body or a query parameter is malformed (not JSON, empty, nested too deeply, or "
    "a parameter of the wrong type)",
    "401": "No token, or a wrong one",
    "404": "No such backend",
    "404-application": "No such application (UnknownApplication), or it keeps no such revision "
    "(UnknownRevision)",
    "404-revision": "No such backend, or it keeps no such revision (UnknownRevision)",
    "409": "Valid, but it cannot be placed on the runtime (beside what runs already), or its "
    "route leads to another backend (RouteConflict); nothing was applied",
    "409-log": "A replica's log file is a symlink or not a regular file (LogRefused): it is "
    "not read, never followed",
    "409-rollout": "Refused as the backend is now, with the reason as the error's type: Paused "
    "(resume it first), Deleting, NoGoodRevision (no earlier revision completed: name one), or "
    "CodeChanged (the entrypoint's source on disk is not the revision's: undo with force); "
    "nothing was written",
    "413": "The body is over 1 MiB",
    "429": "Too many wrong tokens from this client address, with answers still held "
    "(TooManyFailures): try again after Retry-After; the right token is never refused",
    "415": "The body is not sent as application/json",
    "422": "The body is JSON but breaks a rule; `problems` lists each, naming the field",
    "403": "A console session may not do this (make a login link), or its change lacks the "
    "session's X-Console-Key header",
    "501": "This runtime keeps no replica logs the daemon can read",
    "404-node": "The runtime has no such node, or a prefix names several (UnknownNode)",
    "501-node": "This runtime has no nodes to tell apart (LocalRuntime: one machine) "
    "(NodesUnsupported)",
    "503": "The daemon is shutting down and takes no more changes, or the store cannot be "
    "written, or it is a standby while no daemon leads (NoLeader) (then with Retry-After); "
    "nothing was applied",
}
_STANDBY = (
    "This daemon is a standby (NotLeader): changes go to the leader, whose URL for the same "
    "request is in Location (and its API's address in the error's `leader`); nothing was "
    "applied here"
)


#: What a request that writes a body-given change may answer besides 200.
WRITE_ERRORS = ("400", "409", "413", "415", "422", "503")


def operation(
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
    for key in ("401", "429", *errors):
        code = key.partition("-")[0]
        response: dict[str, Any] = {
            "description": _ERRORS[key],
            "content": {JSON_BODY: {"schema": ref("Error")}},
        }
        if code == "401":
            response["headers"] = {"WWW-Authenticate": {"schema": STRING, "required": True}}
        if code in ("429", "503"):
            response["headers"] = {"Retry-After": {"schema": INT}}
        responses[code] = response
    if "503" in errors:
        # Every change is taken by the leader only.
        responses["307"] = {
            "description": _STANDBY,
            "headers": {"Location": {"schema": STRING, "required": True}},
            "content": {JSON_BODY: {"schema": ref("Error")}},
        }
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if description is not None:
        op["description"] = description
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {
            "required": body_required,
            "content": {JSON_BODY: {"schema": ref(body)}},
        }
    return op


def answer(code: str, description: str, schema: str) -> dict[str, Any]:
    return {code: {"description": description, "content": {JSON_BODY: {"schema": ref(schema)}}}}


def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": description}


def long_poll(since: str) -> list[dict[str, Any]]:
    """The query of a long poll: a cursor (`since` says what none means), its epoch, a wait."""
    return [
        query("since", COUNT, since),
        query("epoch", STRING, "The epoch of the last answer"),
        query(
            "timeout_s",
            {"type": "number", "minimum": 0, "maximum": 60},
            "How long to wait for a change (30 if not given)",
        ),
    ]


def flag(name: str, description: str) -> dict[str, Any]:
    # Sent as the words true or false; anything else is a 400.
    return query(name, BOOL, description)
