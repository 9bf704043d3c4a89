"""The paths of the API as one table: each one's pattern, the methods it takes, its handler
(``handlers``), and what it needs of a request (a body, the token, a leading daemon)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from . import applications as apps
from .handlers import Answer, Call, Handlers

Handler = Callable[[Handlers, Call], Awaitable[Answer]]


@attrs.frozen
class Route:
    """A path of the API: the methods it takes (HEAD wherever GET is; any other gets 405 with
    Allow) and its handler."""

    pattern: re.Pattern[str]
    methods: tuple[str, ...]
    handler: Handler
    bodies: frozenset[str] = frozenset()
    """The methods whose request body it reads."""
    public: bool = False
    """Answered without the token."""
    anywhere: bool = False
    """A change this daemon takes while it stands by (a login link is its own)."""
    for_routers: bool = False
    """Read with the route token too (what replicas hold to follow the routes)."""


def _path(pattern: str, methods: str, handler: Handler, **flags: Any) -> Route:
    return Route(re.compile(pattern), tuple(methods.split()), handler, **flags)


_NAME = r"/api/v1/backends/([^/]+)"
_APP = r"/api/v1/applications/([^/]+)"
_ROUTES = [
    _path(r"/healthz", "GET HEAD", Handlers._healthz, public=True),
    _path(r"/metrics", "GET HEAD", Handlers._metrics),
    _path(r"/openapi\.json", "GET HEAD", Handlers._openapi),
    _path(r"/api/v1/ingress", "GET HEAD", Handlers._ingress_status),
    _path(r"/api/v1/backends", "GET HEAD", Handlers._backends),
    _path(_NAME, "GET HEAD PUT DELETE", Handlers._backend, bodies=frozenset({"PUT"})),
    _path(_NAME + "/logs", "GET HEAD", Handlers._logs_of),
    _path(_NAME + "/revisions", "GET HEAD", Handlers._revisions_of),
    _path(_NAME + "/(undo|pause|resume|restart|promote|abort)", "POST", Handlers._steer),
    _path(_NAME + "/scale", "POST", Handlers._scale),
    _path(_NAME + "/history", "GET HEAD", Handlers._history_of),
    _path(r"/api/v1/applications", "GET HEAD", apps.list_applications),
    _path(_APP, "GET HEAD DELETE", apps.application),
    _path(_APP + "/revisions", "GET HEAD", apps.revisions),
    _path(_APP + "/(undo|restart|promote|abort)", "POST", apps.steer),
    _path(r"/api/v1/changes", "GET HEAD", Handlers._changes_since),
    _path(r"/api/v1/console/links", "POST", Handlers._login_link, anywhere=True),
    _path(r"/api/v1/apply", "POST", Handlers._apply_body, bodies=frozenset({"POST"})),
    _path(r"/api/v1/apply/diff", "POST", Handlers._diff_body, bodies=frozenset({"POST"})),
    _path(r"/api/v1/watch", "GET HEAD", Handlers._watch_since, for_routers=True),
    _path(r"/api/v1/load", "POST", Handlers._load, bodies=frozenset({"POST"})),
    _path(r"/api/v1/nodes", "GET HEAD", Handlers._nodes),
    _path(r"/api/v1/nodes/([^/]+)/(drain|cordon|uncordon)", "POST", Handlers._steer_node),
    _path(r"/api/v1/shutdown", "POST", Handlers._shutdown_call),
]


def find_route(path: str) -> tuple[Route | None, tuple[str, ...]]:
    """The route of `path`, and what its pattern matched."""
    for route in _ROUTES:
        match = route.pattern.fullmatch(path)
        if match is not None:
            return route, match.groups()
    return None, ()
