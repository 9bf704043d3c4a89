"""The daemon once built: it serves its API and ingress until one trigger asks it to stop, then
stops in phases, each wait with a deadline, so that a stop never hangs on one part and the
lease is handed over before the process exits.

Shaped like hypercorn's ``worker_serve``: nested nurseries, so that no phase outlives the one
around it, outermost first:

- the daemon's: the trigger's signal task, the loop-lag meter, the timelines and the ingress
  supervision; cancelled last, once the API has closed (the ingress processes keep running);
- the ingress's start, once the API serves: not cut short by a stop (the processes it starts
  must be seen serving before an earlier daemon's are stopped; it has its own deadline,
  `START_TIMEOUT_S`), and waited for once the API has closed;
- the API's: the HTTP server, told to close once the lease is handed over: it stops accepting,
  and its connections (long polls, the shutdown's answer) get `API_GRACE_S`;
- the roles': standby or leader; cancelled first, then the lease is released (within two
  renewals), so that a standby takes over at once.

The trigger (`Stop`) is pulled by the first of: SIGINT or SIGTERM (replicas keep running, for
the next start to adopt), ``POST /api/v1/shutdown`` (every backend drained and deleted first,
within the longest drain and kill and `SHUTDOWN_MARGIN_S`, and the ingress processes stopped,
within `FLEET_STOP_S`), or the roles ending. Pulled while the roles start, it stops the start
where it is; a signal during a shutdown cuts its wait for the deletes short.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any, Literal, final

import attrs
import hypercorn.config
import hypercorn.trio
import trio

from .._api.app import Api
from .._api.metrics import Metrics
from .._api.timeline import Timelines
from .._api.timeline import record as record_timelines
from .._api.views import iso
from .._backend.tasks import KILL_TIMEOUT_S
from .._core.controller import Controller
from .._model.values.errors import ControllerError, StoreError
from .._ports.runtime import LogSource
from .ingress_fleet import Fleet
from .ingress_process import DRAIN_S
from .ingress_records import STOP_MARGIN_S
from .roles import Roles, role_of
from .statedir import StateDir

logger = logging.getLogger("controller.daemon")

#: Beyond the longest drain and kill, how long ``controller shutdown`` waits for the runtime.
SHUTDOWN_MARGIN_S = 30.0
#: Once the API closes, how long its open connections have: long polls end at once, and
#: nothing else takes long.
API_GRACE_S = 2.0
#: How long a shutdown waits for the ingress processes to stop: past the fleet's own bounds
#: (an earlier daemon's processes, then its own: each a drain and a margin; a margin after the
#: kill), so that this only ends a stop that hangs.
FLEET_STOP_S = 2 * (DRAIN_S + STOP_MARGIN_S) + 2 * STOP_MARGIN_S
#: Beyond the standbys' time to read the lease, how long a shutdown waits to remove what the
#: store runs beside its data (Ray's fencing actor).
RETIRE_S = 10.0

Cause = Literal["signal", "shutdown", "roles"]


@final
class Stop:
    """The daemon's one shutdown trigger: the first cause pulled says how the daemon stops."""

    def __init__(self) -> None:
        self.cause: Cause | None = None
        self._pulled = trio.Event()
        self.starting = trio.CancelScope()
        """Around the roles' start: a stop asked then ends the start where it is."""
        self.draining = trio.CancelScope()
        """Around a shutdown's wait for the deletes: a signal cuts it short (what is left, the
        next start finishes)."""

    def pull(self, cause: Cause) -> None:
        if self.cause is None:
            self.cause = cause
            self._pulled.set()
            self.starting.cancel()
        elif cause == "signal":
            self.draining.cancel()

    async def wait(self) -> Cause:
        await self._pulled.wait()
        assert self.cause is not None
        return self.cause


@attrs.frozen
class Front:
    """What clients reach: the API's socket (bound already), and the ingress processes."""

    api: socket.socket
    fleet: Fleet | None


@attrs.frozen
class WithNodes:
    """The daemon's ingress as the API shows it: its own processes, and the ingress on each
    node of a Ray cluster (``nodes``)."""

    fleet: Fleet | None
    nodes: Any

    async def status(self) -> dict[str, Any]:
        mine = await self.fleet.status() if self.fleet is not None else None
        base = mine or {"listen": None, "workers": 0, "processes": []}
        nodes = [{**e, "since": iso(e["since"])} for e in self.nodes.status()]
        return {**base, "nodes": nodes}

    async def metrics(self) -> bytes:
        return await self.fleet.metrics() if self.fleet is not None else b""


async def serve(
    roles: Roles,
    state: StateDir,
    front: Front,
    token: str,
    metrics: Metrics,
    logs: LogSource | None,
    keep_token: Callable[[], None],
) -> None:
    """Serve until the trigger is pulled, then stop in phases (see the module's docstring)."""
    stop = Stop()
    answered = trio.Event()
    left: list[str] = []
    current = roles.serving

    async def shutdown_done() -> list[str]:
        await answered.wait()
        return left

    fleet = front.fleet

    timelines = Timelines()
    app = Api(
        None,
        token=token,
        render_metrics=metrics.render,
        request_shutdown=partial(stop.pull, "shutdown"),
        shutdown_done=shutdown_done,
        logs=logs,
        serving=current,
        timelines=timelines,
        ingress=fleet if roles.node_ingresses is None else WithNodes(fleet, roles.node_ingresses),
    )
    config = hypercorn.config.Config()
    # Our socket, bound already; hypercorn takes it over (and closes it when it stops).
    fd = front.api.detach()
    config.bind = [f"fd://{fd}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # through our handlers, once
    config.graceful_timeout = API_GRACE_S
    address_file = state.address
    # The API's own trigger: it closes once the lease is handed over.
    closing = trio.Event()

    async def run_roles(*, task_status: trio.TaskStatus[None]) -> None:
        await roles.run(task_status=task_status)
        # They end by an error (which ends the daemon through the nurseries) or by the stop's
        # cancel; should they return, the daemon stops as on a signal.
        stop.pull("roles")

    async def start_serving(api: trio.Nursery, ingress: trio.Nursery, daemon: trio.Nursery) -> None:
        """The API; then, in `ingress`, the ingress processes, which follow it."""
        daemon.start_soon(record_timelines, current, timelines)
        keep_token()
        binds = await api.start(
            # hypercorn types the app as its own ASGI union; ours is plain dicts.
            partial(hypercorn.trio.serve, app, config, shutdown_trigger=closing.wait)  # type: ignore[arg-type]
        )
        # hypercorn marks its sockets inheritable (for its own worker processes); ours must
        # not be, or a child could keep the port open after we exit.
        os.set_inheritable(fd, False)
        url = binds[0]
        state.write_address(url, secrets.token_hex(8))
        if roles.node_ingresses is not None:
            roles.node_ingresses.follow(url, token)
        ingress.start_soon(start_ingress, daemon, url)

    async def start_ingress(daemon: trio.Nursery, url: str) -> None:
        """The ingress processes, supervised in `daemon`; then the start is over. A stop asked
        meanwhile does not wait for this, but the daemon's exit does: the processes started
        here must be seen serving before an earlier daemon's are stopped."""
        if fleet is not None:
            # The ingress processes follow the API: they start once it answers, and take
            # their first connection with the routes known.
            await daemon.start(fleet.run)
        if stop.cause is not None:
            return  # stopping already: neither the ingress nor the API is there to be used
        if fleet is not None:
            count = len(fleet.members)
            logger.info(
                "ingress serving routes on http://%s (%d process%s)",
                fleet.address,
                count,
                "" if count == 1 else "es",
            )
        logger.info(
            "listening on %s (token in %s), %s",
            url,
            state.token,
            role_of(roles.leadership),
        )

    async def shut_down() -> None:
        """What a shutdown does while the roles still lead: every backend deleted, then the
        ingress processes stopped."""
        if current.ctl is not None:
            left.extend(await _wait_deleted(current.ctl, stop.draining))
        if fleet is not None:
            with trio.move_on_after(FLEET_STOP_S):
                await fleet.stop()
        if roles.node_ingresses is not None:
            with trio.move_on_after(FLEET_STOP_S):
                await roles.node_ingresses.stop()

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as daemon:
            daemon.start_soon(_on_signals, signals, stop, state)
            daemon.start_soon(metrics.measure_loop_lag)
            # Cancelled last: what it has not logged yet of wrong tokens is logged then.
            daemon.start_soon(app.throttle.run)
            # The API closes before the ingress's start is waited for.
            async with trio.open_nursery() as ingress, trio.open_nursery() as api:
                async with trio.open_nursery() as roles_nursery:
                    with stop.starting:
                        # Leads (recovered, the config applied) or stands by (the store's view
                        # built) before anything is served.
                        await roles_nursery.start(run_roles)
                    if stop.cause is None:
                        await start_serving(api, ingress, daemon)
                    if await stop.wait() == "shutdown":
                        await shut_down()
                    state.mark_stopping()
                    # Stop leading (the controller closes): the lease can go.
                    roles_nursery.cancel_scope.cancel()
                # Released before the API's connections (long polls) close: a standby takes
                # over at once.
                renew_s = roles.leadership.timing.renew_s
                released = None
                with trio.move_on_after(renew_s * 2, shield=True):
                    released = await roles.leadership.release()
                if stop.cause == "shutdown" and released is not None:
                    # Unless a standby takes over, nothing of this store is left running.
                    with trio.move_on_after(renew_s * 4 + RETIRE_S, shield=True):
                        with contextlib.suppress(StoreError):
                            await roles.leadership.retire_if_alone(released)
                if stop.cause == "shutdown":
                    # The request waiting for this answers at once; the server's graceful stop
                    # gives it the time to.
                    answered.set()
                closing.set()
            daemon.cancel_scope.cancel()
    with contextlib.suppress(FileNotFoundError):
        address_file.unlink()


async def _on_signals(signals: AsyncIterator[int], stop: Stop, state: StateDir) -> None:
    """The first SIGINT or SIGTERM pulls the trigger (or cuts a shutdown's drain short); later
    ones are taken and ignored: the stop under way goes on."""
    async for signum in signals:
        state.mark_stopping()
        logger.info(
            "%s: stopping; replicas keep running for the next start to adopt",
            signal.Signals(signum).name,
        )
        stop.pull("signal")
        return


async def _wait_deleted(ctl: Controller, cut: trio.CancelScope) -> list[str]:
    """Wait until every backend is gone (their deletes are durable already), within the
    longest drain and kill of any: no longer, as no drain takes longer. `cut` ends the wait
    early (a signal)."""
    backends = ctl.status().backends
    longest = max((b.backend_config.graceful_shutdown_timeout_s for b in backends), default=0.0)
    limit = longest + KILL_TIMEOUT_S + SHUTDOWN_MARGIN_S
    logger.info("shutdown asked: draining and deleting every backend (for at most %gs)", limit)
    # Until none is left, not until each delete's goal: a forced delete meanwhile (which cuts
    # a drain short) supersedes the goal while its kills are still under way.
    why = None
    with cut, trio.move_on_after(limit) as timer:
        try:
            await ctl.wait_until(lambda c: not c.status().backends)
        except ControllerError:
            # It stopped acting (a lease it could not renew in time): its words say why.
            why = "the controller stopped before they were deleted"
    left = [b.name for b in ctl.status().backends]
    if left:
        if why is None:
            why = f"still being deleted after {limit:g}s" if timer.cancelled_caught else "cut short"
        logger.error(
            "shutdown: %s: %s; stopping anyway: their replicas keep running, and the next "
            "start finishes the deletes",
            ", ".join(left),
            why,
        )
    return left
