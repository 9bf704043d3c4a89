"""``GET /api/v1/backends``: every backend's status, or a page of them, filtered by state.

Pages follow the names' order: ``limit`` backends after the name ``after``, and ``next`` (the
``after`` of the next page; null on the last one). Only the page's statuses are built, so a page of
a thousand backends costs a page, not the thousand. ``view=summary`` leaves out each backend's
replicas and events, the bulk of a status.
"""

from __future__ import annotations

from typing import Any

from .._core.controller import Controller
from .._model.views.status import BackendState
from .http import HTTPError, int_param
from .views import status_json

#: The largest page.
MAX_LIMIT = 10_000
_STATES = {s.value: s for s in BackendState}


def list_backends(ctl: Controller, query: dict[str, list[str]]) -> dict[str, Any]:
    limit = int_param(query, "limit", None, low=1, high=MAX_LIMIT)
    after = query.get("after", [None])[-1]
    states = _states(query)
    view = query.get("view", ["full"])[-1]
    if view not in ("full", "summary"):
        raise HTTPError(400, "BadQuery", f"view must be full or summary, not {view!r:.40}")
    page: list[dict[str, Any]] = []
    following: str | None = None
    for name in ctl.backend_names():
        if after is not None and name <= after:
            continue
        # The summary says the state at the cost of a few counts: a filter skips backends
        # without building their full status.
        status = ctl.summary(name)
        if states is not None and status.state not in states:
            continue
        if limit is not None and len(page) == limit:
            following = page[-1]["name"]
            break
        if view != "summary":
            status = ctl.status(name)
        page.append(status_json(status, summary=view == "summary"))
    listed: dict[str, Any] = {"backends": page}
    if limit is not None:
        listed["next"] = following
    return listed


def _states(query: dict[str, list[str]]) -> set[BackendState] | None:
    """``state=HEALTHY&state=UPDATING`` (or ``state=HEALTHY,UPDATING``): any of these."""
    asked = [part for value in query.get("state", []) for part in value.split(",")]
    if not asked:
        return None
    unknown = sorted({a for a in asked if a not in _STATES})
    if unknown:
        raise HTTPError(
            400,
            "BadQuery",
            f"state must be among {', '.join(_STATES)}; not {', '.join(unknown)[:200]}",
        )
    return {_STATES[a] for a in asked}
