"""An ingress on every node that needs one: the daemon's node (the head, where its driver is)
and each node holding a serving replica of a routed backend. Each is ``controller ingress`` in a
process of its own on its node (``_ingress_host``), listening on the node's address at the
configured port and following the leading daemon over its API, as any ingress does; so traffic
enters wherever the cluster's load balancer sends it, and a node without replicas keeps no
ingress (the cluster's autoscaler can remove it).

The set follows the backends: the leader re-reads it after each pass of a backend's loop that
moved a replica (a change of the watch snapshots), never on a timer. An ingress whose process
ends is started again with a backoff; one whose node is no longer wanted is stopped (its
requests under way finish first).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Protocol, final

import attrs
import ray
import trio

from .._clock import wall_now
from .._model.records.replica_state import ReplicaState
from .._model.views.status import BackendStatus
from ._await import wait_ref
from ._ingress_host import IngressHost

logger = logging.getLogger("controller.ray")

_Host = ray.remote(IngressHost)
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
#: How long a node's ingress may take to start.
START_S = 60.0


class Controller(Protocol):
    """What the node ingresses read of the leading controller (its public face)."""

    def backend_names(self) -> list[str]: ...

    def status(self, name: str) -> BackendStatus: ...

    async def wait_until(self, predicate: Callable[[Any], bool]) -> None: ...


@attrs.define
class NodeIngress:
    """One node's ingress, as ``GET /api/v1/ingress`` lists it under ``nodes``."""

    node: str
    state: str = "starting"
    """``starting``, ``serving``, ``restarting`` or ``stopping``."""
    address: str | None = None
    pid: int | None = None
    since: float = attrs.field(factory=time.time)
    restarts: int = 0
    last_exit: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "state": self.state,
            "address": self.address,
            "pid": self.pid,
            "since": self.since,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }


def wanted_nodes(ctl: Controller, head: str | None) -> frozenset[str]:
    """The head, and each node with a running replica of a routed backend."""
    nodes = set() if head is None else {head}
    for name in ctl.backend_names():
        status = ctl.status(name)
        if status.backend_config.route_prefix is None:
            continue
        nodes.update(
            r.node
            for r in status.replicas
            if r.node is not None and r.state is ReplicaState.RUNNING
        )
    return frozenset(nodes)


async def _then_cancel(nursery: trio.Nursery, wait: Callable[[], Awaitable[object]]) -> None:
    await wait()
    nursery.cancel_scope.cancel()


def _moved(ctl: Controller, *, head: str | None, wanted: frozenset[str]) -> bool:
    return wanted_nodes(ctl, head) != wanted


@final
class NodeIngresses:
    """Run by the leading daemon, with its controller, once its API's URL is known."""

    def __init__(self, namespace: str, port: int, host: str | None = None):
        self.namespace = f"{namespace}-ingress"
        """Not the replicas' namespace: its runtime would take these actors for strays."""
        self.port = port
        self.host = host
        self.ingresses: dict[str, NodeIngress] = {}
        self._follow: tuple[str, str, Sequence[str]] | None = None
        self._known = trio.Event()
        self._stop_asked = trio.Event()
        self._emptied = trio.Event()
        self._dropping: set[str] = set()
        """Nodes whose ingress is being stopped (no longer wanted). Any other end of its task
        (this daemon stops or loses the lead) leaves it running, for the next leader."""

    def follow(self, url: str, token: str, also_urls: Sequence[str] = ()) -> None:
        """Where the ingresses find the daemon's API (set once it serves)."""
        self._follow = (url, token, tuple(also_urls))
        self._known.set()

    async def stop(self) -> None:
        """Stop every node's ingress (a shutdown), and return once they are gone."""
        self._stop_asked.set()
        while self.ingresses:
            # A fresh event each wait: one set when a lost lead emptied the list must not
            # pass for the stop of those a later lead started.
            self._emptied = trio.Event()
            await self._emptied.wait()

    def status(self) -> list[dict[str, Any]]:
        return [self.ingresses[node].to_json() for node in sorted(self.ingresses)]

    async def run(self, ctl: Controller) -> None:
        """Keep an ingress on each wanted node while `ctl` leads (cancelled when it stops)."""
        await self._known.wait()
        head = ray.get_runtime_context().get_node_id()
        running: dict[str, trio.CancelScope] = {}
        async with trio.open_nursery() as nursery:
            while True:
                stopping = self._stop_asked.is_set()
                wanted = frozenset() if stopping else wanted_nodes(ctl, head)
                for node in wanted - running.keys():
                    running[node] = await nursery.start(self._keep, node)
                for node in running.keys() - wanted:
                    self._dropping.add(node)
                    running.pop(node).cancel()
                if stopping:
                    return  # once the stops under way end, with the nursery
                async with trio.open_nursery() as race:
                    # A pass that moves the set, or a stop: whichever comes first.
                    race.start_soon(
                        _then_cancel,
                        race,
                        partial(ctl.wait_until, partial(_moved, head=head, wanted=wanted)),
                    )
                    race.start_soon(_then_cancel, race, self._stop_asked.wait)

    async def _keep(self, node: str, *, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        """Keep `node`'s ingress serving, until cancelled: then stop it."""
        # Its own entry: a stop of this node's last ingress may still be finishing.
        entry = self.ingresses[node] = NodeIngress(node)
        with trio.CancelScope() as scope:
            task_status.started(scope)
            handle = None
            attempt = 0
            try:
                while True:
                    try:
                        handle = await trio.to_thread.run_sync(self._actor, node)
                        entry.last_exit = await self._serve(entry, handle)
                    except ray.exceptions.RayError as exc:  # the actor (or its node) died
                        entry.last_exit = str(exc).strip().splitlines()[0]
                    entry.state, entry.restarts = "restarting", entry.restarts + 1
                    logger.warning("ingress on node %s ended: %s", node[:12], entry.last_exit)
                    await trio.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
                    attempt += 1
            finally:
                if scope.cancel_called and node in self._dropping:
                    self._dropping.discard(node)
                    entry.state = "stopping"
                    with trio.move_on_after(20, shield=True):
                        if handle is not None:
                            await self._stop(handle)
                    logger.info("ingress on node %s stopped", node[:12])
                if self.ingresses.get(node) is entry:
                    del self.ingresses[node]
                if not self.ingresses:
                    self._emptied.set()

    async def _serve(self, entry: NodeIngress, handle: Any) -> str:
        """Start the node's ingress and wait until it ends; say how it ended."""
        reply: dict[str, Any] | None = None
        with trio.move_on_after(START_S):
            reply = json.loads(await wait_ref(handle.start.remote(self._spec())))
        if reply is None:
            return f"it did not start within {START_S:g}s"
        if not reply.get("ok"):
            return str(reply.get("error"))
        entry.state, entry.since = "serving", wall_now()
        entry.address, entry.pid = reply["address"], reply["pid"]
        logger.info("ingress on node %s serving on %s", entry.node[:12], entry.address)
        ended = json.loads(await wait_ref(handle.wait_exit.remote()))
        return f"{ended['exit']}: {ended['log']}"

    def _spec(self) -> str:
        assert self._follow is not None
        url, token, also = self._follow
        spec = {"url": url, "token": token, "also_urls": list(also), "port": self.port}
        return json.dumps({**spec, "host": self.host})

    def _actor(self, node: str) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return _Host.options(
            name=f"ingress-{node}",
            namespace=self.namespace,
            lifetime="detached",
            get_if_exists=True,  # an earlier daemon's: adopted, its process kept
            max_restarts=0,
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote()

    async def _stop(self, handle: Any) -> None:
        with contextlib.suppress(ray.exceptions.RayError):
            await wait_ref(handle.stop.remote())
        await trio.to_thread.run_sync(lambda: ray.kill(handle, no_restart=True))
