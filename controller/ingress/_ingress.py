"""The ingress: follows a watch source, routes each request to a replica of its backend, and
reports its load back. One object per process; serve it on as many listeners as you like."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import secrets
import socket
from collections.abc import Iterator, Sequence
from typing import Any, final

import attrs
import trio
from prometheus_client import generate_latest

from .._model.status import LOAD_TTL_S, LoadReport
from ._admission import Admission
from ._client import Client
from ._config import IngressConfig
from ._hangups import Hangups
from ._metrics import IngressMetrics
from ._proxy import Proxy
from ._ratelimit import RateLimitedLog
from ._routing import RouteTable
from ._sockets import close
from ._sources import SourceError, WatchSource
from ._table import BackendRoutes, RouteInfo
from ._timers import Timers
from ._upstream import Pool

logger = logging.getLogger("controller.ingress")

#: Load reports per backend are sent at most this often (and only on change).
REPORT_INTERVAL_S = 0.1
#: How soon a report that did not go through is sent again.
RETRY_REPORT_S = 0.5
#: Connections taken from a listener's queue in one go before other tasks run.
_ACCEPT_BATCH = 64
_BACKOFF_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


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
    table: RouteTable = attrs.field(factory=RouteTable, init=False)
    _backends: dict[str, BackendRoutes] = attrs.field(factory=dict, init=False)
    _routed: dict[str, RouteInfo] = attrs.field(factory=dict, init=False)
    _dirty: set[str] = attrs.field(factory=set, init=False)
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _sent: dict[str, LoadReport] = attrs.field(factory=dict, init=False)
    _conflicts: frozenset[str] = attrs.field(factory=frozenset, init=False)
    metrics: IngressMetrics = attrs.field(init=False)
    proxy: Proxy = attrs.field(init=False)
    admission: Admission = attrs.field(init=False)
    _accepting: list[trio.CancelScope] = attrs.field(factory=list, init=False)
    _retry_now: trio.Event = attrs.field(factory=trio.Event, init=False)
    connected: bool = attrs.field(default=False, init=False)
    """Whether the last call to the source worked."""
    _warnings: RateLimitedLog = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        config = self.config
        self.admission = Admission(config.max_connections, config.max_connections_per_client)
        self.metrics = IngressMetrics(
            self.load, lambda: (self.admission.open, self.admission.idle_count)
        )
        self.proxy = Proxy(self, Pool(config.connect_timeout_s), config, self.metrics)
        self._warnings = RateLimitedLog(logger)

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

    # -- running --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the source and report load, until cancelled. Started once the first answer
        of the source is taken (or it failed once: then routing begins with no routes)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._report_load)
            await self._follow(task_status)

    async def serve(
        self,
        listeners: Sequence[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve client connections on `listeners` until cancelled, or, after `close`, until
        the connections open then have ended."""
        hangups, timers = Hangups(), Timers()
        accepting = trio.CancelScope()
        self._accepting.append(accepting)
        try:
            # The hang-up watch and the deadlines outlive the connections they serve.
            async with trio.open_nursery() as services:
                services.start_soon(hangups.run)
                services.start_soon(timers.run)
                async with trio.open_nursery() as connections:
                    with accepting:
                        async with trio.open_nursery() as accepts:
                            for listener in listeners:
                                accepts.start_soon(
                                    self._accept, listener, connections, hangups, timers
                                )
                            task_status.started()
                services.cancel_scope.cancel()
        finally:
            self._accepting.remove(accepting)
            self.proxy.pool.close_all()
            hangups.close()

    def retry_now(self) -> None:
        """Try the source again at once, if it could not be reached (a daemon that has just
        started again says so)."""
        self._retry_now.set()

    def close(self) -> None:
        """Stop taking connections: the listeners close, idle kept-alive connections close at
        once, new ones once they have had their first request answered (or `CLOSING_GRACE_S`
        passed without one), and the others after the request under way; ``serve`` then
        returns (bound the wait with a deadline of your own)."""
        self.admission.closing = True
        for scope in self._accepting:
            scope.cancel()
        for client in self.admission.idle_connections():
            if isinstance(client, Client):
                client.closing_now()

    async def _accept(
        self,
        listener: trio.SocketListener,
        nursery: trio.Nursery,
        hangups: Hangups,
        timers: Timers,
    ) -> None:
        # Accepted on a socket of our own over the listener's descriptor (a duplicate, closed
        # here): plain non-blocking calls, as the connections use (see _sockets).
        with listener.socket, _own_socket(listener.socket) as sock:
            try:
                while True:
                    await trio.lowlevel.wait_readable(sock)
                    for _ in range(_ACCEPT_BATCH):
                        try:
                            conn, address = sock.accept()
                        except BlockingIOError:
                            break
                        except OSError as exc:
                            # Out of descriptors, say: give those open a moment to finish.
                            self._warnings.warn(
                                "accept", "ingress: accept failed (%s); pausing 0.1 s", exc
                            )
                            await trio.sleep(0.1)
                            break
                        self._admit(conn, address, nursery, hangups, timers)
            finally:
                if self.admission.closing:
                    # Closing a listener resets what waits in its queue, though its siblings
                    # on the port (SO_REUSEPORT) would have taken it: take it all now, and
                    # close at once after, so that only what arrives in between is lost.
                    while True:
                        try:
                            conn, address = sock.accept()
                        except OSError:
                            break
                        self._admit(conn, address, nursery, hangups, timers)

    def _admit(
        self,
        conn: socket.socket,
        address: Any,
        nursery: trio.Nursery,
        hangups: Hangups,
        timers: Timers,
    ) -> None:
        peer = str(address[0]) if isinstance(address, tuple) else "-"
        verdict = self.admission.admit(peer)
        if verdict.refused is not None:
            # Closed unanswered: an answer would be lost anyway in the reset that closing a
            # socket with unread bytes sends.
            conn.close()
            self.metrics.refused(verdict.refused)
            self._warnings.warn(
                f"refused-{verdict.refused}",
                "ingress: connection from %s refused (%s)",
                peer,
                "it has max_connections_per_client open"
                if verdict.refused == "per_client"
                else "max_connections open, none idle",
            )
            return
        if isinstance(verdict.evict, Client):
            self.metrics.refused("evicted")
            verdict.evict.evict()
        conn.setblocking(False)
        with contextlib.suppress(OSError):  # not TCP (a Unix socket): nothing to set
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = Client(conn, peer, self.config, self.proxy, self.admission, timers, hangups)
        nursery.start_soon(self._serve_one, client)

    async def _serve_one(self, client: Client) -> None:
        try:
            await client.serve()
        except Exception:
            # A bug must not take the ingress down: the connection is closed (its slots are
            # given back by the proxy's own finally), and the fault logged.
            self._warnings.warn(
                "connection-error",
                "ingress: connection from %s failed",
                client.peer,
                exc_info=True,
            )

    async def _follow(self, task_status: trio.TaskStatus[None]) -> None:
        started = False
        failures = 0
        while True:
            try:
                infos, complete = await self.source.changes()
            except SourceError as exc:
                if self.connected or failures == 0:
                    logger.warning(
                        "ingress: %s is unreachable (%s); routing on the last snapshot and "
                        "trying again",
                        self.source.describe(),
                        exc,
                    )
                self.connected = False
                failures += 1
                if not started:
                    task_status.started()
                    started = True
                with trio.move_on_after(_BACKOFF_S[min(failures, len(_BACKOFF_S)) - 1]):
                    await self._retry_now.wait()
                self._retry_now = trio.Event()
                continue
            if not self.connected and failures:
                logger.info("ingress: following %s again", self.source.describe())
            self.connected, failures = True, 0
            await self._take(infos, complete)
            # A source that answers at once, again and again, must not starve the other tasks.
            await trio.lowlevel.checkpoint()
            if not started:
                task_status.started()
                started = True

    async def _take(self, infos: list[RouteInfo], complete: bool) -> None:
        routed = {} if complete else dict(self._routed)
        for info in infos:
            routed.pop(info.name, None)
            if info.exists and not info.deleting and info.route_prefix is not None:
                routed[info.name] = info
        left: list[str] = []
        for name in [n for n in self._backends if n not in routed]:
            gone = self._backends.pop(name)
            left.extend(s.address for s in gone.slots)
            gone.update(attrs.evolve(self._routed[name], replicas=()))  # wakes its queue
            self._dirty.add(name)
        for name, info in routed.items():
            known = self._backends.get(name)
            if known is None:
                known = self._backends[name] = BackendRoutes(
                    name, self.rng, self._changed, local_host=self.config.prefer_host
                )
            if self._routed.get(name) != info:
                left.extend(s.address for s in known.update(info))
        self._routed = routed
        table, losers = RouteTable.build((i.route_prefix or "/", n) for n, i in routed.items())
        for name in sorted(set(losers) - self._conflicts):
            logger.warning(
                "ingress: backend %s's route %s is another backend's too; the lower name has it",
                name,
                routed[name].route_prefix,
            )
        self._conflicts = frozenset(losers)
        for prefix in sorted(self.table.routes.keys() - table.routes.keys()):
            logger.info("ingress: route %s removed", prefix)
        for prefix, name in sorted(table.routes.items()):
            if self.table.routes.get(prefix) != name:
                logger.info("ingress: route %s -> backend %s", prefix, name)
        self.table = table
        for address in left:
            self.proxy.pool.forget(address)

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


async def open_listener(host: str, port: int, *, reuse_port: bool = False) -> trio.SocketListener:
    """A listening socket on `host`:`port` (port 0: any free one). With `reuse_port`, several
    processes may listen on one port (``SO_REUSEPORT``) and the kernel spreads connections
    over them. Not inheritable: a replica never holds it open."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await sock.bind((host, port))
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


def listener_port(listener: trio.SocketListener) -> int:
    return int(listener.socket.getsockname()[1])


@contextlib.contextmanager
def _own_socket(listener: trio.socket.SocketType) -> Iterator[socket.socket]:
    sock = socket.socket(
        listener.family, listener.type, listener.proto, fileno=os.dup(listener.fileno())
    )
    try:
        sock.setblocking(False)
        yield sock
    finally:
        close(sock)
