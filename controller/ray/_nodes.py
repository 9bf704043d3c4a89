"""RayRuntime's nodes: what the cluster says of them, where a new replica goes, and a watch
that tells the controller when a node dies or is announced to go.

Ray has no stream of node changes a driver can follow (its GCS publishes them to raylets), so
the watch reads the node table and the draining nodes once a second, in a thread: two small
round trips to the control store, and nothing when nothing changed. A node's death is also told
per replica by each actor's monitor call; the watch only makes it sooner where Ray is slow to
fail those calls.

Placement is the controller's, by the spec's rules (``_model.config.nodes.choose_node``): each actor
is pinned to its node with ``NodeAffinitySchedulingStrategy(soft=False)``, so Ray's own first fit
neither spreads nor packs for us, and a cordoned node gets nothing new.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, final

import ray
import trio
from ray._private import state as ray_state

from .._model.config.nodes import Candidate, NodeInfo, choose_node, label_keys
from .._model.decisions.placement import SLOTS
from .._model.decisions.spec import ReplicaSpec

logger = logging.getLogger("controller.ray")

#: How often the watch reads the cluster's nodes.
WATCH_S = 1.0
# BackendConfig.resources keys that Ray takes as keyword arguments; any other key is a custom
# resource. Ray counts memory in bytes.
NAMED = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
# Resources Ray reports per node that replicas cannot ask for.
NOT_SCHEDULABLE = ("node:", "accelerator_type:", "object_store_memory")
# The default limit on replicas per node: one per this much of the node's memory (each actor is
# a Ray worker process of its own, about 100 MiB).
MEMORY_PER_REPLICA = 128 << 20


def read_nodes() -> list[NodeInfo]:
    """The cluster's nodes now (blocking: run it in a thread)."""
    draining: Mapping[str, int] = ray_state.state.get_draining_nodes()
    out = []
    for entry in ray.nodes():  # type: ignore[no-untyped-call]
        node = str(entry.get("NodeID", ""))
        deadline_ms = draining.get(node)
        out.append(
            NodeInfo(
                node,
                str(entry.get("NodeManagerAddress", "")),
                bool(entry.get("Alive")),
                {str(k): str(v) for k, v in (entry.get("Labels") or {}).items()},
                deadline_ms is not None,
                deadline_ms / 1000 if deadline_ms else None,
            )
        )
    return out


def resources_per_node() -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Per node, its totals and what is free now (exhausted keys left out); blocking."""
    # Developer APIs of Ray, straight to the control store (no dashboard needed).
    totals = ray_state.total_resources_per_node()  # type: ignore[no-untyped-call]
    available = ray_state.available_resources_per_node()  # type: ignore[no-untyped-call]
    return totals, available


@final
class RayNodes:
    """The nodes as last read, the cordons, and the choice of a node for a start."""

    def __init__(self, max_per_node: int | None):
        self._max_per_node = max_per_node
        self.known: dict[str, NodeInfo] = {}
        self.cordoned: frozenset[str] = frozenset()

    def slots(self, total: Mapping[str, float]) -> int:
        """How many replicas a node of `total` holds at all."""
        return max(1, self._max_per_node or int(total.get("memory", 0.0) // MEMORY_PER_REPLICA))

    def schedulable(self, node: str, total: Mapping[str, float]) -> dict[str, float] | None:
        """What a live, uncordoned node offers replicas (its labels as keys), or None."""
        info = self.known.get(node)
        if node in self.cordoned or (info is not None and (not info.alive or info.draining)):
            return None
        offered = {k: v for k, v in total.items() if not k.startswith(NOT_SCHEDULABLE)}
        return {**offered, **label_keys(info.labels if info is not None else {})}

    async def capacity(
        self, ours: Iterable[tuple[str | None, Mapping[str, float]]]
    ) -> list[dict[str, float]]:
        """``Runtime.capacity``: each node that takes new replicas, with what others than
        `ours` (each actor's node and resources) leave free there."""
        totals, available = await trio.to_thread.run_sync(resources_per_node)
        held: dict[str, dict[str, float]] = {}
        for node, resources in ours:
            if node is not None:
                mine = held.setdefault(node, {})
                for key, amount in resources.items():
                    mine[key] = mine.get(key, 0.0) + amount
        nodes = []
        for node, total in sorted(totals.items()):
            offered = self.schedulable(node, total)
            if offered is None:
                continue  # cordoned, draining or dead: no room for anything new
            free, mine = available.get(node, {}), held.get(node, {})
            # What others hold is total - available - ours; what we may use is the rest. (A
            # label's key is no amount: kept as it is.)
            room = {
                key: min(amount, free.get(key, 0.0) + mine.get(key, 0.0))
                if key in total
                else amount
                for key, amount in offered.items()
            }
            room[SLOTS] = float(self.slots(total))
            nodes.append(room)
        return nodes

    async def choose(
        self,
        spec: ReplicaSpec,
        placed: Callable[[], Iterable[tuple[str | None, str, Mapping[str, float]]]],
    ) -> str | None:
        """The node for `spec`'s replica by its rules, given where this runtime's actors are
        (`placed`, read after the cluster is: node, backend and resources of each)."""
        self.known = {n.id: n for n in await trio.to_thread.run_sync(read_nodes)}
        totals, available = await trio.to_thread.run_sync(resources_per_node)
        held: dict[str, int] = {}
        count: dict[str, int] = {}
        for node, backend, _ in placed():
            if node is not None:
                count[node] = count.get(node, 0) + 1
                if backend == spec.backend:
                    held[node] = held.get(node, 0) + 1
        candidates = []
        for node, total in totals.items():
            if self.schedulable(node, total) is None:
                continue
            free = available.get(node, {})
            fits = all(
                free.get(key, 0.0) >= amount for key, amount in spec.resources.items() if amount > 0
            )
            info = self.known.get(node)
            labels = info.labels if info is not None else {}
            candidates.append(Candidate(node, labels, fits, self.slots(total) - count.get(node, 0)))
        return choose_node(candidates, held, spec.rules, self.cordoned)

    async def watch(self, changed: Callable[[], None], lost: Callable[[str], None]) -> None:
        """Read the nodes every `WATCH_S`; on a change, call `changed`, and `lost(node)` for
        each node that died."""
        seen: dict[str, tuple[bool, bool]] = {}
        while True:
            try:
                nodes = await trio.to_thread.run_sync(read_nodes)
            except Exception as exc:  # the control store may be briefly away
                logger.warning("reading the cluster's nodes: %s", exc)
                nodes = []
            if nodes:
                self.known = {n.id: n for n in nodes}
                now = {n.id: (n.alive, n.draining) for n in nodes}
                for node, (alive, _) in now.items():
                    if not alive and seen.get(node, (False, False))[0]:
                        lost(node)
                if seen and now != seen:
                    changed()
                seen = now
            await trio.sleep(WATCH_S)


def placement_options(node: str | None) -> dict[str, Any]:
    """The actor's options that pin it to `node`."""
    if node is None:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}
