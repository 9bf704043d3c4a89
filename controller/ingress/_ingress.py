"""The ingress: follows a watch source, routes each request to a replica of its backend, and
reports its load back. One object per process; serve it on as many listeners as you like."""

from __future__ import annotations

import json
import logging
import os
import random
import secrets
import socket
from collections.abc import Sequence
from typing import final

import attrs
import trio
from prometheus_client import generate_latest

from .._http.server import Server
from .._model.views.status import LOAD_TTL_S, LoadReport
from .._routing.choice import RouteTable
from .._routing.router import Router
from .._routing.sources import SourceError, WatchSource
from .._routing.table import BackendRoutes, RouteInfo
from .._routing.upstream import Pool
from ._config import IngressConfig
from ._metrics import IngressMetrics
from ._proxy import Proxy

logger = logging.getLogger("controller.ingress")

#: Load reports per backend are sent at most this often (and only on change).
REPORT_INTERVAL_S = 0.1
#: How soon a report that did not go through is sent again.
RETRY_REPORT_S = 0.5


def _source_id() -> str:
    return f"ingress-{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}"


@final
@attrs.define(eq=False)
class Ingress:
    """Routes HTTP requests to the replicas a watch source lists. Start ``run`` (it follows
    the source and reports load) with ``nursery.start``; then ``serve`` on listeners."""

    source: WatchSource
    config: IngressConfig = attrs.field(factory=IngressConfig)
    source_id: str = attrs.field(factory=_source_id)
    """Who this ingress is in its load reports."""
    rng: random.Random = attrs.field(factory=random.Random)
    router: Router = attrs.field(init=False)
    """Its routed backends and their replicas, from the source."""
    _dirty: set[str] = attrs.field(factory=set, init=False)
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _sent: dict[str, LoadReport] = attrs.field(factory=dict, init=False)
    metrics: IngressMetrics = attrs.field(init=False)
    proxy: Proxy = attrs.field(init=False)
    server: Server = attrs.field(init=False)
    """What takes and serves its client connections."""

    def __attrs_post_init__(self) -> None:
        config = self.config
        pool = Pool(config.connect_timeout_s)
        self.router = Router(
            self.source,
            "ingress",
            routed_only=True,
            prefer_host=config.prefer_host,
            rng=self.rng,
            on_change=self._changed,
            on_left=pool.forget_all,
        )
        self.metrics = IngressMetrics(
            self.load, self._connections, self._policy_counts, access_log=config.access_log
        )
        self.proxy = Proxy(self, pool, config, self.metrics)
        self.server = Server(config, self.proxy, logger, "ingress", self.metrics.refused)

    @property
    def table(self) -> RouteTable:
        return self.router.table

    @property
    def connected(self) -> bool:
        """Whether the last call to the source worked."""
        return self.router.connected

    def routes(self) -> dict[str, RouteInfo]:
        """The routing it uses, by backend name: each backend's route, limits and serving
        replicas (tag, address, version), and a canary release's split of its requests, as
        its watch source last said them."""
        return self.router.routes

    async def link_changed(self) -> None:
        """Return once `connected` has changed."""
        await self.router.link_changed()

    @property
    def _backends(self) -> dict[str, BackendRoutes]:
        return self.router.backends

    def _connections(self) -> tuple[int, int]:
        admission = self.server.admission
        return admission.open, admission.idle_count

    # -- what the proxy reads --

    def backend(self, name: str) -> BackendRoutes | None:
        return self._backends.get(name)

    def builtin(self, path: str) -> tuple[int, bytes, bytes] | None:
        if path == "/-/healthz":
            body = {
                "ok": True,
                "pid": os.getpid(),
                "source": self.source.describe(),
                "connected": self.connected,
            }
            return 200, b"application/json", json.dumps(body).encode()
        if path == "/-/routes":
            return (
                200,
                b"application/json",
                json.dumps(dict(sorted(self.table.routes.items()))).encode(),
            )
        if path == "/-/metrics":
            return (
                200,
                b"text/plain; version=0.0.4; charset=utf-8",
                generate_latest(self.metrics.registry),
            )
        return None

    def load(self) -> dict[str, tuple[int, int]]:
        """Per backend: requests in flight to its replicas, and requests queued."""
        return {name: (sum(b.in_flight().values()), b.queued) for name, b in self._backends.items()}

    def _policy_counts(self) -> dict[str, dict[str, int]]:
        return {name: b.counts for name, b in self._backends.items() if b.counts}

    # -- running --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the source and report load, until cancelled. Started once the first answer
        of the source is taken (or it failed once: then routing begins with no routes)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._report_load)
            await self.router.run(task_status=task_status)

    async def serve(
        self,
        listeners: Sequence[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve client connections on `listeners` until cancelled, or, after `close`, until
        the connections open then have ended."""
        try:
            await self.server.serve(listeners, task_status=task_status)
        finally:
            self.proxy.pool.close_all()

    def retry_now(self) -> None:
        """Try the source again at once, if it could not be reached (a daemon that has just
        started again says so)."""
        self.router.retry_now()

    def close(self) -> None:
        """Stop taking connections: the listeners close, idle kept-alive connections close at
        once, new ones once they have had their first request answered (or `CLOSING_GRACE_S`
        passed without one), and the others after the request under way; ``serve`` then
        returns (bound the wait with a deadline of your own)."""
        self.server.close()

    # -- load reports --

    def _changed(self, backend: BackendRoutes) -> None:
        self._dirty.add(backend.name)
        self._wake.set()

    async def _report_load(self) -> None:
        # Sent on change, at most every REPORT_INTERVAL_S; every routed backend's report, zeros
        # included, is sent again every third of the controller's TTL, so that it stays
        # counted: a live ingress's zero is a signal (an autoscaler may scale down on it), while
        # a dead ingress's silence is none.
        refresh_s = LOAD_TTL_S / 3
        retry = False
        while True:
            # After a report that did not go through, try again soon: a queued request of a
            # backend at zero waits on it (the daemon restarting, or a takeover under way).
            with trio.move_on_after(RETRY_REPORT_S if retry else refresh_s) as idle:
                await self._wake.wait()
            self._wake = trio.Event()
            names = set(self._dirty)
            self._dirty.clear()
            if idle.cancelled_caught:
                names |= set(self._backends) | set(self._sent)
            reports = []
            for name in sorted(names):
                routes = self._backends.get(name)
                report = LoadReport(
                    self.source_id,
                    name,
                    routes.in_flight() if routes is not None else {},
                    routes.queued if routes is not None else 0,
                )
                tallies = routes.take_tallies() if routes is not None else {}
                if tallies:
                    report = attrs.evolve(report, traffic=tallies)
                if self._sent.get(name) != report or idle.cancelled_caught or tallies:
                    reports.append(report)
            if reports:
                try:
                    await self.source.report(reports)
                except SourceError as exc:
                    logger.debug("ingress: load report not sent: %s", exc)
                    self._dirty.update(r.backend for r in reports)
                    for report in reports:
                        kept = self._backends.get(report.backend)
                        if kept is not None and report.traffic:
                            kept.give_back(dict(report.traffic))
                    retry = True
                else:
                    retry = False
                    for report in reports:
                        if report.backend in self._backends:
                            self._sent[report.backend] = attrs.evolve(report, traffic={})
                        else:
                            self._sent.pop(report.backend, None)  # gone: its last zero is sent
            await trio.sleep(REPORT_INTERVAL_S)
