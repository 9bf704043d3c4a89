"""A process's view of where requests may go, kept from a watch source: every backend's replicas
and queue (``table.BackendRoutes``), and the route prefixes of those that are routed. The
ingress routes client requests with it; a replica's handles call other backends with it: the
same choice, queue, limits and canary split for both.

It follows its source until cancelled: each answer updates the backends in place (a replica
gone leaves the choice at once; those waiting in a queue no replica will empty hear so), and a
source that cannot be reached leaves the last view standing while it is tried again."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import final

import attrs
import trio

from .choice import RouteTable
from .sources import SourceError, WatchSource
from .table import BackendRoutes, RouteInfo

logger = logging.getLogger("controller.routing")

_BACKOFF_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


def _nothing(backend: BackendRoutes) -> None:
    pass


def _none_left(addresses: list[str]) -> None:
    pass


@final
@attrs.define(eq=False)
class Router:
    """Start ``run`` with ``nursery.start`` (started once the source's first answer is taken,
    or it failed once); then read `backends` and `table`."""

    source: WatchSource
    name: str = "router"
    """What its log lines begin with (``ingress``, ``handles``)."""
    routed_only: bool = False
    """Keep only the backends that are routed (an ingress's); else every one (handles call
    backends by name, routed or not)."""
    prefer_host: str | None = None
    """Replicas at this host are tried first (``IngressConfig.prefer_host``)."""
    rng: random.Random = attrs.field(factory=random.Random)
    on_change: Callable[[BackendRoutes], None] = _nothing
    """Told when a backend's in-flight or queued counts change (an ingress reports its load)."""
    on_left: Callable[[list[str]], None] = _none_left
    """Told the addresses of replicas that left (their pooled connections can close)."""
    backends: dict[str, BackendRoutes] = attrs.field(factory=dict, init=False)
    table: RouteTable = attrs.field(factory=RouteTable, init=False)
    connected: bool = attrs.field(default=False, init=False)
    """Whether the last call to the source worked."""
    _known: dict[str, RouteInfo] = attrs.field(factory=dict, init=False)
    _conflicts: frozenset[str] = attrs.field(factory=frozenset, init=False)
    _retry_now: trio.Event = attrs.field(factory=trio.Event, init=False)
    _taken: trio.Event = attrs.field(factory=trio.Event, init=False)
    _link: trio.Event = attrs.field(factory=trio.Event, init=False)
    """Set (and replaced) whenever `connected` changes."""

    def retry_now(self) -> None:
        """Try the source again at once, if it could not be reached (a daemon that has just
        started again says so)."""
        self._retry_now.set()

    @property
    def routes(self) -> dict[str, RouteInfo]:
        """What it routes on: each backend as the source last said it (``RouteInfo``)."""
        return dict(self._known)

    async def link_changed(self) -> None:
        """Return once `connected` has changed."""
        await self._link.wait()

    def _connected(self, now: bool) -> None:
        if now != self.connected:
            self.connected = now
            self._link.set()
            self._link = trio.Event()

    async def wait_taken(self) -> None:
        """Return once the next answer of the source has been taken."""
        await self._taken.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the source, until cancelled."""
        started = False
        failures = 0
        while True:
            try:
                infos, complete = await self.source.changes()
            except SourceError as exc:
                # A source that ends as its owner stops us (a closing controller ends its watch
                # and cancels its handles' router) is no outage: the cancellation goes first.
                await trio.lowlevel.checkpoint_if_cancelled()
                if self.connected or failures == 0:
                    logger.warning(
                        "%s: %s is unreachable (%s); routing on the last snapshot and trying again",
                        *(self.name, self.source.describe(), exc),
                    )
                self._connected(False)
                failures += 1
                if not started:
                    task_status.started()
                    started = True
                with trio.move_on_after(_BACKOFF_S[min(failures, len(_BACKOFF_S)) - 1]):
                    await self._retry_now.wait()
                self._retry_now = trio.Event()
                continue
            if not self.connected and failures:
                logger.info("%s: following %s again", self.name, self.source.describe())
            self._connected(True)
            failures = 0
            self.take(infos, complete)
            self._taken.set()
            self._taken = trio.Event()
            # A source that answers at once, again and again, must not starve the other tasks.
            await trio.lowlevel.checkpoint()
            if not started:
                task_status.started()
                started = True

    def take(self, infos: list[RouteInfo], complete: bool) -> None:
        """One answer of the source: the backends that changed (all of them, if `complete`)."""
        kept = {} if complete else dict(self._known)
        for info in infos:
            kept.pop(info.name, None)
            if (
                info.exists
                and not info.deleting
                and (info.route_prefix is not None or not self.routed_only)
            ):
                kept[info.name] = info
        left: list[str] = []
        for name in [n for n in self.backends if n not in kept]:
            gone = self.backends.pop(name)
            left.extend(s.address for s in gone.slots)
            gone.update(attrs.evolve(self._known[name], replicas=()))  # wakes its queue
            self.on_change(gone)
        for name, info in kept.items():
            known = self.backends.get(name)
            if known is None:
                known = self.backends[name] = BackendRoutes(
                    name, self.rng, self.on_change, local_host=self.prefer_host
                )
            if self._known.get(name) != info:
                left.extend(s.address for s in known.update(info))
        self._known = kept
        self._route(kept)
        if left:
            self.on_left(left)

    def _route(self, kept: dict[str, RouteInfo]) -> None:
        claims = ((i.route_prefix, n) for n, i in kept.items() if i.route_prefix is not None)
        table, losers = RouteTable.build(claims)
        for name in sorted(set(losers) - self._conflicts):
            logger.warning(
                "%s: backend %s's route %s is another backend's too; the lower name has it",
                *(self.name, name, kept[name].route_prefix),
            )
        self._conflicts = frozenset(losers)
        for prefix in sorted(self.table.routes.keys() - table.routes.keys()):
            logger.info("%s: route %s removed", self.name, prefix)
        for prefix, name in sorted(table.routes.items()):
            if self.table.routes.get(prefix) != name:
                logger.info("%s: route %s -> backend %s", self.name, prefix, name)
        self.table = table
