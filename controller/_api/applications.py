"""The API's paths of applications (``/api/v1/applications``): each a handler taking the
daemon's ``Handlers`` and the call, as the routes' table takes them."""

from __future__ import annotations

from typing import Any

import attrs

from .._model.config.applications import ApplicationStatus, AppRevision
from .bodies import optional_json, restart_request, steer_request, undo_request
from .handlers import Answer, Call, Handlers, by_console
from .http import flag, ok
from .views import cause_json, iso


async def list_applications(h: Handlers, call: Call) -> Answer:
    apps = h._ctl.applications
    return ok({"applications": [application_json(apps.status(n)) for n in apps.names()]})


async def application(h: Handlers, call: Call) -> Answer:
    (name,) = call.args
    apps = h._ctl.applications
    if call.method == "GET":
        return ok(application_json(apps.status(name)))
    force = flag(call.query, "force", default=False)  # DELETE
    if not force:
        h._check_accepting()
    goals = await apps.delete(name, force=force)
    return ok({"name": name, "generations": {m: g.generation for m, g in goals.items()}}, 202)


async def revisions(h: Handlers, call: Call) -> Answer:
    (name,) = call.args
    apps = h._ctl.applications
    kept = apps.revisions(name)
    latest = kept[-1].number if kept else None
    listed = [
        revision_json(r, current=r.number == latest, restorable=apps.restorable(r)) for r in kept
    ]
    return ok({"name": name, "revisions": listed})


async def steer(h: Handlers, call: Call) -> Answer:
    """Undo, restart, promote or abort every member at once."""
    name, what = call.args
    apps = h._ctl.applications
    apps.record(name)  # an unknown name is a 404 before the body is read
    body = await optional_json(call.scope, call.receive)
    if what == "undo":
        to_revision, force, cause = undo_request(body)
        h._check_accepting()
        await apps.undo(name, to_revision, force=force, cause=by_console(cause, call.by_session))
    elif what == "restart":
        cause = by_console(restart_request(body), call.by_session)
        h._check_accepting()
        await apps.restart(name, cause=cause)
    else:
        via = by_console(steer_request(body), call.by_session).via
        h._check_accepting()
        await apps.steer_canary(name, what, via)
    return ok(application_json(apps.status(name)), 202)


def application_json(status: ApplicationStatus) -> dict[str, Any]:
    return {
        "name": status.name,
        "entry": status.entry,
        "revision": status.revision,
        "state": status.state,
        "members": [attrs.asdict(m) for m in status.members],
    }


def revision_json(revision: AppRevision, *, current: bool, restorable: bool) -> dict[str, Any]:
    return {
        "number": revision.number,
        "members": dict(revision.members),
        "created_at": iso(revision.created_at),
        "undone_to": revision.undone_to,
        "restart": revision.restart,
        "restorable": restorable,
        "cause": cause_json(revision.cause),
        "current": current,
    }
