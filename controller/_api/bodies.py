"""The bodies and queries of the API's requests that change specs, parsed and checked before
anything is written: each fault is a 422 (or 415) naming the field."""

from __future__ import annotations

from typing import Any

from .._model.config.cause import Cause
from .._model.config.config import MAX_REPLICAS
from .._model.config.manifest import BackendDecl, parse_backend
from .._model.records.records import MAX_REVISION
from .._model.values.errors import ConfigError
from .._model.values.numbers import whole
from .http import HTTPError, Receive, Scope, parse_json, read_body

#: The cause's fields as a request names them.
_REQUEST_NAMES = {
    "cause.message": "message",
    "cause.manifest": "source",
    "cause.manifest_digest": "source_digest",
}
#: Who may be named as asking, over HTTP: the API itself, or the CLI through it.
_VIA = ("api", "cli")


def backend_from_body(name: str, data: Any) -> BackendDecl:
    decl, problems = parse_backend(name, data)
    if decl is None:
        raise HTTPError(422, "InvalidBackend", "; ".join(problems), problems=problems)
    return decl


def cause_of(
    *,
    via: object,
    message: object = None,
    manifest: object = None,
    manifest_digest: object = None,
) -> Cause:
    """The cause of a change asked over HTTP, checked before anything is written (422 naming
    the request's field: ``message``, ``source``, ``source_digest``)."""
    if via not in _VIA:
        # "python" is for calls in the controller's own process, which a request is not.
        raise HTTPError(422, "Invalid", f'via: must be "api" or "cli" (got {via!r:.40})')
    try:
        return Cause(via=via, message=message, manifest=manifest, manifest_digest=manifest_digest)
    except ConfigError as exc:
        # Named as the request names it: the body's `source`, not the cause's `manifest`.
        said = str(exc).replace(exc.field, _REQUEST_NAMES.get(exc.field, exc.field), 1)
        raise HTTPError(422, "Invalid", said, problems=[said]) from None


async def optional_json(scope: Scope, receive: Receive) -> Any:
    """A body that may be left out: none at all (or an empty one) reads as ``{}``. One that is
    sent must be JSON, sent as such."""
    if not any(key == b"content-type" for key, _ in scope["headers"]):
        # Read under the same bound as any body, only to learn that nothing was sent.
        headers = [*scope["headers"], (b"content-type", b"application/json")]
        if await read_body({**scope, "headers": headers}, receive):
            raise HTTPError(
                415, "UnsupportedMediaType", "the body must be sent as application/json"
            )
        return {}
    body = await read_body(scope, receive)
    return parse_json(body) if body else {}


def undo_request(data: Any) -> tuple[int | None, bool, Cause]:
    """An undo's body: ``{"to_revision": N | null, "force": bool, "message": str | null,
    "via": "api" | "cli"}``, every field optional."""
    if not isinstance(data, dict):
        raise HTTPError(422, "Invalid", "the body must be an object")
    unknown = sorted(set(data) - {"to_revision", "force", "message", "via"})
    if unknown:
        raise HTTPError(422, "Invalid", f"unknown fields: {', '.join(unknown)}")
    to_revision = data.get("to_revision")
    if to_revision is not None:
        number = whole(to_revision)
        if number is None or not 1 <= number <= MAX_REVISION:
            raise HTTPError(
                422, "Invalid", "to_revision: must be a revision's number (a whole number >= 1)"
            )
        to_revision = number
    force = data.get("force", False)
    if not isinstance(force, bool):
        raise HTTPError(422, "Invalid", "force: must be true or false")
    cause = cause_of(via=data.get("via", "api"), message=data.get("message"))
    return to_revision, force, cause


def restart_request(data: Any) -> Cause:
    """A restart's body: ``{"message": str | null, "via": "api" | "cli" | "console"}``, every
    field optional."""
    if not isinstance(data, dict):
        raise HTTPError(422, "Invalid", "the body must be an object")
    unknown = sorted(set(data) - {"message", "via"})
    if unknown:
        raise HTTPError(422, "Invalid", f"unknown fields: {', '.join(unknown)}")
    return cause_of(via=data.get("via", "api"), message=data.get("message"))


def steer_request(data: Any) -> Cause:
    """A promote's or an abort's body: ``{"via": "api" | "cli"}``, optional."""
    if not isinstance(data, dict):
        raise HTTPError(422, "Invalid", "the body must be an object")
    unknown = sorted(set(data) - {"via"})
    if unknown:
        raise HTTPError(422, "Invalid", f"unknown fields: {', '.join(unknown)}")
    return cause_of(via=data.get("via", "api"))


def scale_request(data: Any) -> tuple[int | None, dict[str, int], str | None]:
    """A scale's body: ``{"replicas": N}`` for a fixed backend, ``{"min_replicas": A,
    "max_replicas": B}`` (either or both) for an autoscaled one, and an optional ``message``.
    The counts are checked against the backend by the controller (``ConfigError``: 422)."""
    if not isinstance(data, dict):
        raise HTTPError(422, "Invalid", "the body must be an object")
    unknown = sorted(set(data) - {"replicas", "min_replicas", "max_replicas", "message"})
    if unknown:
        raise HTTPError(422, "Invalid", f"unknown fields: {', '.join(unknown)}")
    counts: dict[str, int | None] = {}
    for field in ("replicas", "min_replicas", "max_replicas"):
        value = data.get(field)
        number = None if value is None else whole(value)
        if value is not None and (number is None or not 0 <= number <= MAX_REPLICAS):
            said = f"{field}: must be a whole number from 0 to {MAX_REPLICAS}"
            raise HTTPError(422, "Invalid", said, problems=[said])
        counts[field] = number
    if all(n is None for n in counts.values()):
        said = "replicas (or, for an autoscaled backend, min_replicas and max_replicas): needed"
        raise HTTPError(422, "Invalid", said, problems=[said])
    message = data.get("message")
    bounds = {k: n for k in ("min_replicas", "max_replicas") if (n := counts[k]) is not None}
    return counts["replicas"], bounds, message
