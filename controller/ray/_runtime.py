"""RayRuntime: each replica is a named, detached Ray actor hosting the user's class.

Fencing (several controllers sharing one namespace, one of them the leader of an epoch; see
``Runtime.fence``): every call to an actor carries this runtime's epoch, and the actor, which
remembers the highest epoch that has commanded it, refuses one from a lower epoch (see ``_host``);
the refusal is raised as ``FencedError``. Starts and adoptions (the actor's ``ready``) raise its
epoch. Ray's ``ray.kill`` cannot be refused by the actor, so a kill first asks the actor to
``stop``: only once it has accepted (and so is committed to ending, taking no other command) is
it killed. An actor that does not answer within `_STOP_ANSWER_S` (hung: an event loop blocked by
user code, a stopped process) cannot check anything and is killed all the same, as is one that
Ray has not placed yet (no process, nothing to ask): the two cases in which a stale leader's kill
may land. A start is not fenced here beyond its ``ready``: the store, which refuses the stale
leader's intent before it asks for a start, does that.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, final

import attrs
import ray
import ray.exceptions
import ray.util
import trio

from .._model.config.nodes import NodeInfo
from .._model.decisions.spec import ReplicaSpec
from .._model.values.errors import ConfigError, FencedError, ReplicaError, ReplicaGoneError
from .._model.values.json_values import JSON
from .._ports.hosting import host_spec
from .._ports.runtime import CheckReport, DeathListener, LogChunk, ReplicaInfo, Watchers, check_each
from ._await import wait_ref, wait_refs
from ._errors import first_line, is_alive, ray_error, read_actor_log
from ._host import ReplicaHost
from ._nodes import NAMED, RayNodes, placement_options, read_nodes
from ._own_load import follow_load

logger = logging.getLogger("controller.ray")

_Host = ray.remote(ReplicaHost)

# How long to wait before watching again an actor Ray calls unavailable (its node is unreachable
# for now, which may pass) rather than dead.
_UNAVAILABLE_RETRY_S = 1.0
#: How long a kill waits for the actor to accept its stop before killing it unasked.
_STOP_ANSWER_S = 5.0
#: What an actor's method is called in a FencedError.
_WHAT = {
    "ready": "start or adoption",
    "reconfigure": "reconfigure",
    "check_health": "health check",
    "drain": "drain",
    "stop": "kill",
}


@final
@attrs.define(eq=False)
class _Actor:
    tag: str
    handle: Any
    resources: Mapping[str, float]
    node_id: str | None = None
    """Set once ready: where its resources are held."""
    methods: frozenset[str] | None = None
    """Set once ready: which optional methods of the replica contract its class has."""
    killing: bool = False
    """Set when the stop is ours, so that the monitor does not report it as a death."""
    death_call: Any = None
    """The monitor's call in flight (it ends only when the actor does), for a kill to wait on
    rather than sending another."""


@final
class RayRuntime:
    """Replicas as named, detached actors of a Ray cluster, in `namespace`.

    Connect to the cluster (``ray.init``) before the controller opens. The namespace belongs to
    the runtime: a controller adopts the actors of it that its intent names and kills the rest, so
    give each controller its own. ``BackendConfig.resources`` map to the actor's ``num_cpus``
    (key ``CPU``, 0 if absent), ``num_gpus`` (``GPU``), ``memory`` (bytes) and custom resources
    (any other key). `pythonpath` entries are put in front of ``sys.path`` in each actor, so that
    entrypoints can be found. `replica_host` is where replicas serve
    (``controller.worker.context().host``): loopback by default, or None for each node's IP, which
    a cluster of several machines needs. `max_replicas_per_node` is how many replicas a node
    holds at all, whatever they ask for (default: one per 128 MiB of the node's memory).
    """

    def __init__(
        self,
        *,
        namespace: str = "controller",
        pythonpath: Sequence[str | os.PathLike[str]] = (),
        replica_host: str | None = "127.0.0.1",
        max_replicas_per_node: int | None = None,
    ):
        if not namespace:
            raise ConfigError("namespace", "must be a non-empty string", namespace)
        if max_replicas_per_node is not None and (
            isinstance(max_replicas_per_node, bool)
            or not isinstance(max_replicas_per_node, int)
            or max_replicas_per_node < 1
        ):
            raise ConfigError(
                "max_replicas_per_node", "must be a whole number >= 1", max_replicas_per_node
            )
        self._nodes = RayNodes(max_replicas_per_node)
        self._placing: dict[str, tuple[str | None, str, Mapping[str, float]]] = {}
        """Starts whose node is chosen and whose actor is not made yet (counted as placed)."""
        self.namespace = namespace
        self._pythonpath = [str(Path(p).resolve()) for p in pythonpath]
        self._replica_host = replica_host
        self._actors: dict[str, _Actor] = {}
        self._watchers = Watchers("RayRuntime")
        self._epoch = 0
        self._routes: tuple[str, str] | None = None

    @property
    def epoch(self) -> int:
        """The epoch this runtime commands its actors with (0 until ``fence``)."""
        return self._epoch

    def fence(self, epoch: int) -> None:
        """Command actors as the leader of `epoch` from now on (see the module's docstring)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError("epoch", "must be a whole number >= 0", epoch)
        if epoch < self._epoch:
            raise ConfigError(
                "epoch", f"must not be lower than the one fenced before ({self._epoch})", epoch
            )
        self._epoch = epoch

    # -- the Runtime protocol --

    async def serve(
        self,
        on_death: DeathListener,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError("RayRuntime needs a Ray connection: call ray.init() first")

        async def watchers(task_status: trio.TaskStatus[None]) -> None:
            # The actors live on (detached); a controller opened later adopts them.
            # Cancelling the monitors cancelled their calls in the actors too.
            await self._watchers.serve(on_death, task_status, self._actors.clear)

        async with trio.open_nursery() as nursery:
            await nursery.start(watchers)
            nursery.start_soon(self._nodes.watch, self._watchers.nodes_changed, self._node_lost)
            task_status.started()

    # -- nodes (NodeRuntime) --

    async def nodes(self) -> Sequence[NodeInfo]:
        return await trio.to_thread.run_sync(read_nodes)

    def cordon(self, nodes: frozenset[str]) -> None:
        self._nodes.cordoned = frozenset(nodes)

    def _node_lost(self, node: str) -> None:
        """Its actors are dead: say so now, rather than when each one's monitor call fails."""
        for tag, actor in list(self._actors.items()):
            if actor.node_id == node and not actor.killing:
                del self._actors[tag]
                self._watchers.lost_with_node(tag, node, f"actor died: its node {node[:12]} died")

    async def capacity(self) -> Sequence[Mapping[str, float]] | None:
        return await self._nodes.capacity([(a.node_id, a.resources) for a in self._actors.values()])

    async def list_replicas(self) -> Sequence[str]:
        named = await trio.to_thread.run_sync(lambda: ray.util.list_named_actors(True))
        return sorted(
            entry["name"]
            for entry in named
            if isinstance(entry, dict) and entry["namespace"] == self.namespace
        )

    def publish_routes(self, url: str, token: str) -> None:
        """Where the handles of the replicas it starts from now on follow the routes: a
        daemon's API at `url` (reachable from every node), read with `token` (the route token,
        which reads the watch and changes nothing). Given to each actor with its spec."""
        self._routes = (url, token)

    async def start_replica(self, spec: ReplicaSpec) -> ReplicaInfo:
        self._watchers.check_running()
        payload = {
            **host_spec(spec, self._pythonpath),
            "host": self._replica_host,
            "resources": dict(spec.resources),
            "routes": self._routes,
        }
        options: dict[str, Any] = {
            "name": spec.tag,
            "namespace": self.namespace,
            "lifetime": "detached",
            "get_if_exists": True,  # a retried start of the same tag must not make a second
            "max_restarts": 0,  # a replica that dies is replaced by the controller, fresh
            "num_cpus": 0,
        }
        custom = {}
        for key, amount in spec.resources.items():
            if key in NAMED:
                options[NAMED[key]] = int(amount) if key == "memory" else amount
            else:
                custom[key] = amount
        if custom:
            options["resources"] = custom
        text = json.dumps(payload)
        node = await self._nodes.choose(spec, self._placed)
        if node is None:
            raise ReplicaError(
                spec.tag,
                "Unschedulable",
                "no node may take it now: none that is alive, not cordoned or draining, "
                "admitted by its node_labels and under its max_replicas_per_node has room",
            )
        # Counted as placed from here (no checkpoint since the choice), so that starts at once
        # spread as one would one after another.
        self._placing[spec.tag] = (node, spec.backend, dict(spec.resources))
        options.update(placement_options(node))
        try:
            # Registering a named actor is a blocking round trip to the cluster's control store.
            handle = await trio.to_thread.run_sync(lambda: _Host.options(**options).remote(text))
        finally:
            del self._placing[spec.tag]
        actor = _Actor(spec.tag, handle, dict(spec.resources), node_id=node)
        self._actors[spec.tag] = actor
        return await self._await_ready(actor)

    def _placed(self) -> list[tuple[str | None, str, Mapping[str, float]]]:
        placed = [(a.node_id, a.tag.rpartition("#")[0], a.resources) for a in self._actors.values()]
        return placed + list(self._placing.values())

    async def adopt_replica(self, tag: str) -> ReplicaInfo:
        self._watchers.check_running()
        actor = await self._find(tag)  # its ready reply tells what it holds
        return await self._await_ready(actor)

    async def reconfigure_replica(self, tag: str, user_config: JSON) -> None:
        await self._call(tag, "reconfigure", json.dumps(user_config), self._epoch, optional=True)

    async def check_health_replica(self, tag: str) -> None:
        # Asked even of a class without check_health: the answer shows the actor is responsive.
        await self._call(tag, "check_health", self._epoch)

    async def check_health_replicas(self, tags: Sequence[str], report: CheckReport) -> None:
        """A wave of checks: every call submitted in one hop to a thread (Ray's submission
        blocks), and every answer awaited by one task (``wait_refs``), instead of a thread hop
        and a task a check. Actors not known here are looked up and checked one by one."""
        actors = [self._actors[tag] for tag in tags if tag in self._actors]
        unknown = [tag for tag in tags if tag not in self._actors]
        epoch = self._epoch

        def answered(done: list[tuple[int, concurrent.futures.Future[str]]]) -> None:
            results: list[tuple[str, Exception | None]] = []
            for index, future in done:
                actor = actors[index]
                try:
                    self._reply(actor, "check_health", future.result())
                except ray.exceptions.RayError as exc:
                    results.append((actor.tag, ray_error(actor.tag, exc)))
                except (ReplicaError, FencedError) as exc:
                    results.append((actor.tag, exc))
                else:
                    results.append((actor.tag, None))
            report(results)

        async with trio.open_nursery() as nursery:
            if unknown:
                nursery.start_soon(check_each, self, unknown, report)
            if actors:
                calls = await trio.to_thread.run_sync(
                    lambda: [actor.handle.check_health.remote(epoch) for actor in actors]
                )
                await wait_refs(calls, answered)

    async def drain_replica(self, tag: str) -> None:
        await self._call(tag, "drain", self._epoch, optional=True)

    async def kill_replica(self, tag: str) -> None:
        """Kill the actor of `tag` once it has accepted a stop from our epoch; raise
        ``FencedError``, with nothing done, if it refuses (see the module's docstring)."""
        try:
            actor = await self._find(tag)
        except ReplicaGoneError:
            return  # no such actor: already gone
        actor.killing = True
        try:
            await self._ask_to_stop(actor)
        except BaseException:
            actor.killing = False  # it lives on: its death is news again
            raise
        try:
            # A round trip to the control store: never on the trio thread.
            await trio.to_thread.run_sync(lambda: ray.kill(actor.handle, no_restart=True))
            # A call to a dead actor fails at once; one still dying fails when it is dead. Either
            # way, its end means the actor and its resources are gone.
            # Never cancel calls to an actor being killed: Ray 2.60 can abort the dying actor's
            # process on a cancel that races its kill (seen once in the benchmark's logs).
            call = actor.death_call or await trio.to_thread.run_sync(
                actor.handle.wait_until_dead.remote
            )
            with contextlib.suppress(ray.exceptions.RayActorError):
                await wait_ref(call)
        finally:
            if self._actors.get(tag) is actor:
                del self._actors[tag]

    # -- logs (the daemon's LogSource; blocking: called in a thread) --

    def log_tags(self, backend: str | None = None) -> list[str]:
        """The replicas this runtime commands now (a gone actor's log is Ray's alone)."""
        return sorted(t for t in list(self._actors) if backend in (None, t.rpartition("#")[0]))

    def read_log(self, tag: str, *, offset: int | None = None, tail: int = 100) -> LogChunk | None:
        actor = self._actors.get(tag)
        return None if actor is None else read_actor_log(actor.handle, offset, tail)

    # -- internals --

    async def _ask_to_stop(self, actor: _Actor) -> None:
        """Have `actor` accept a stop from our epoch; raise ``FencedError`` if it refuses.
        Returns too if it cannot say: Ray has not placed it, it has died, it has accepted a stop
        already, or it does not answer within `_STOP_ANSWER_S`."""
        alive = await trio.to_thread.run_sync(is_alive, actor.handle)
        if not alive:
            await trio.lowlevel.checkpoint()
            return
        with trio.move_on_after(_STOP_ANSWER_S) as scope:
            with contextlib.suppress(ReplicaError):  # FencedError is not one
                await self._request(actor, "stop", self._epoch)
        if scope.cancelled_caught:
            logger.warning(
                "replica %s: no answer to its stop within %gs; killed unasked",
                actor.tag,
                _STOP_ANSWER_S,
            )

    async def _await_ready(self, actor: _Actor) -> ReplicaInfo:
        reply = await self._request(actor, "ready", self._epoch)
        actor.node_id = reply.get("node_id")
        actor.resources = reply.get("resources") or {}
        actor.methods = frozenset(reply.get("methods", ()))
        self._watchers.start_soon(self._monitor, actor)
        if "load" in actor.methods:
            self._watchers.start_soon(
                follow_load, actor, lambda: self._actors.get(actor.tag) is actor, self._watchers
            )
        address, pid = reply.get("address"), reply.get("pid")
        return ReplicaInfo(
            address if isinstance(address, str) else None,
            pid if isinstance(pid, int) else None,
            actor.node_id,
        )

    async def _find(self, tag: str) -> _Actor:
        """The actor of `tag`: known here, or looked up by name (one this process neither
        started nor adopted, e.g. a stop that a restarted controller finishes)."""
        actor = self._actors.get(tag)
        if actor is not None:
            return actor
        try:
            handle = await trio.to_thread.run_sync(
                lambda: ray.get_actor(tag, namespace=self.namespace)
            )
        except ValueError:
            raise ReplicaGoneError(tag, "no actor has this name") from None
        return self._actors.setdefault(tag, _Actor(tag, handle, {}))

    async def _call(self, tag: str, method: str, *args: str | int, optional: bool = False) -> None:
        actor = await self._find(tag)
        # Fenced, the actor is asked even so: it checks our epoch, and raises its own to it.
        if (
            optional
            and self._epoch == 0
            and actor.methods is not None
            and method not in actor.methods
        ):
            # A round trip to learn that there is nothing to do would only delay the stop.
            await trio.lowlevel.checkpoint()
            return
        await self._request(actor, method, *args)

    async def _request(self, actor: _Actor, method: str, *args: str | int) -> dict[str, Any]:
        try:
            call = await trio.to_thread.run_sync(
                lambda: getattr(actor.handle, method).remote(*args)
            )
            text = await wait_ref(call)
        except ray.exceptions.RayError as exc:
            raise ray_error(actor.tag, exc) from None
        return self._reply(actor, method, text)

    def _reply(self, actor: _Actor, method: str, text: str) -> dict[str, Any]:
        """The actor's answer to `method`, or what it refused with, raised."""
        reply: dict[str, Any] = json.loads(text)
        if not reply.get("ok"):
            newer = reply.get("fenced")
            if isinstance(newer, int) and not isinstance(newer, bool):
                raise FencedError(f"{_WHAT[method]} of replica {actor.tag}", self._epoch, newer)
            if reply.get("error_type") == "ReplicaStopping":
                raise ReplicaGoneError(actor.tag, "its actor accepted a stop and is ending")
            traceback = reply.get("traceback")
            raise ReplicaError(
                actor.tag,
                str(reply.get("error_type")),
                str(reply.get("message")),
                traceback if isinstance(traceback, str) else None,
            )
        return reply

    async def _monitor(self, actor: _Actor) -> None:
        while True:
            call = await trio.to_thread.run_sync(actor.handle.wait_until_dead.remote)
            actor.death_call = call
            try:
                await wait_ref(call)
            except trio.Cancelled:
                # The controller is closing: a live actor should not keep our call waiting for
                # ever. One being killed is left alone (see kill_replica).
                if not actor.killing:
                    ray.cancel(call)
                raise
            except ray.exceptions.ActorUnavailableError:
                actor.death_call = None  # ended without the actor: not one to wait on
                await trio.sleep(_UNAVAILABLE_RETRY_S)
                continue
            except ray.exceptions.RayActorError as exc:
                reason = first_line(exc)
            else:
                reason = "its monitor call returned"  # cannot happen: it waits forever
            break
        if actor.killing or self._actors.get(actor.tag) is not actor:
            return
        # Gone with its node (Ray ends an actor once it declares the node dead): no crash of
        # the replica's own, so not one its replacement should back off for.
        node = actor.node_id
        lost = node is not None and await self._node_dead(node)
        if actor.killing or self._actors.get(actor.tag) is not actor:
            return  # said by the node watch meanwhile
        del self._actors[actor.tag]
        if lost and node is not None:
            self._watchers.lost_with_node(actor.tag, node, f"actor died: its node {node[:12]} died")
        else:
            self._watchers.died(actor.tag, f"actor died: {reason}")

    async def _node_dead(self, node: str) -> bool:
        """Whether Ray says `node` is dead now (False if it cannot be read)."""
        try:
            nodes = await trio.to_thread.run_sync(read_nodes)
        except Exception:
            return False
        return any(n.id == node and not n.alive for n in nodes)
