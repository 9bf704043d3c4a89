"""Each route leads to one backend: the check a deploy passes before its spec is written."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import final

import attrs

from .._model.decisions.spec import Spec
from .._model.values.errors import RouteConflictError


def route_of(spec: Spec) -> str | None:
    """The route a spec keeps: none once its delete was asked."""
    return None if spec.deleting else spec.backend_config.route_prefix


@final
@attrs.define(eq=False)
class RouteClaims:
    """The routes of specs being written, not yet among those last asked: counted too, so that
    two deploys racing for one route cannot both pass."""

    _pending: dict[str, str] = attrs.field(factory=dict)

    def claim(
        self, specs: Mapping[str, Spec], requested: Iterable[tuple[str, Spec]]
    ) -> dict[str, str]:
        """Refuse (``RouteConflictError``) a spec of `specs` whose route another backend keeps
        (in `requested`, what was last asked of each name, or in a commit under way); else
        claim their routes until ``release``."""
        taken = dict(self._pending)
        for name, spec in requested:
            route = route_of(spec)
            if name not in specs and route is not None:
                taken.setdefault(route, name)
        claims: dict[str, str] = {}
        for name in sorted(specs):
            route = route_of(specs[name])
            if route is None:
                continue
            if route in taken:
                raise RouteConflictError(
                    f"backend {name!r}: route_prefix {route!r} leads to backend "
                    f"{taken[route]!r} already; each route leads to one backend. Nothing was "
                    "applied."
                )
            taken[route] = claims[route] = name
        self._pending.update(claims)
        return claims

    def release(self, claims: Mapping[str, str]) -> None:
        """The specs that made `claims` are written (or not): `requested` speaks for them now."""
        for route in claims:
            self._pending.pop(route, None)
