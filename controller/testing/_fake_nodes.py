"""The nodes of a FakeRuntime given ``nodes``: a cluster a test can drain, lose and grow, with
placement by the same rules as RayRuntime's (``_model.config.nodes.choose_node``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import final

import attrs
import trio

from .._model.config.nodes import Candidate, NodeInfo, choose_node, label_keys
from .._model.decisions.placement import SLOTS
from .._model.decisions.spec import ReplicaSpec
from .._model.values.errors import ReplicaError
from .._ports.runtime import tell_nodes_changed
from ._fake_replica import FakeReplica, FakeState, Shared


@final
@attrs.define(eq=False)
class FakeNode:
    """One node of a fake cluster."""

    id: str
    labels: dict[str, str]
    capacity: dict[str, float]
    """What it holds in all, its replica slots included."""
    alive: bool = True
    draining: bool = False
    """The cluster's own notice that it goes (``notice_drain``)."""
    deadline: float | None = None


@final
class FakeNodes:
    """The nodes, in the order given: ties in placement go to the first."""

    def __init__(
        self, nodes: Mapping[str, Mapping[str, str]], capacity: Sequence[dict[str, float]]
    ):
        if len(capacity) not in (1, len(nodes)):
            raise ValueError("give one capacity for every node, or one for all")
        self.by_id: dict[str, FakeNode] = {}
        for index, (node_id, labels) in enumerate(nodes.items()):
            self.add(node_id, labels, capacity[index if len(capacity) > 1 else 0])
        self.cordoned: frozenset[str] = frozenset()

    def add(self, node_id: str, labels: Mapping[str, str], capacity: Mapping[str, float]) -> None:
        if node_id in self.by_id and self.by_id[node_id].alive:
            raise ValueError(f"node {node_id} is there already")
        self.by_id[node_id] = FakeNode(node_id, dict(labels), dict(capacity))

    def infos(self) -> list[NodeInfo]:
        return [
            NodeInfo(n.id, f"fake-{n.id}", n.alive, dict(n.labels), n.draining, n.deadline)
            for n in self.by_id.values()
        ]

    def capacity(self) -> list[dict[str, float]]:
        """Each live node that takes replicas: its total, with its labels as keys."""
        return [
            {**n.capacity, **label_keys(n.labels)}
            for n in self.by_id.values()
            if n.alive and n.id not in self.cordoned and not n.draining
        ]

    def place(self, spec: ReplicaSpec, replicas: Iterable[FakeReplica]) -> str:
        """The node for `spec`'s replica, or a ReplicaError saying why none may take it."""
        used: dict[str, dict[str, float]] = {}
        held: dict[str, int] = {}
        for replica in replicas:
            if replica.state is FakeState.DEAD or replica.node is None:
                continue
            taken = used.setdefault(replica.node, {})
            for key, amount in {**replica.spec.resources, SLOTS: 1.0}.items():
                taken[key] = taken.get(key, 0.0) + amount
            if replica.spec.backend == spec.backend:
                held[replica.node] = held.get(replica.node, 0) + 1
        candidates = []
        for node in self.by_id.values():
            if not node.alive or node.draining:
                continue
            taken = used.get(node.id, {})
            fits = all(
                node.capacity.get(key, 0.0) - taken.get(key, 0.0) >= amount
                for key, amount in spec.resources.items()
                if amount > 0
            )
            slots = int(node.capacity.get(SLOTS, 1e9) - taken.get(SLOTS, 0.0))
            candidates.append(Candidate(node.id, node.labels, fits, slots))
        chosen = choose_node(candidates, held, spec.rules, self.cordoned)
        if chosen is None:
            raise ReplicaError(
                spec.tag, "Unschedulable", "no node may take it now (rules, room or cordons)"
            )
        return chosen


class FakeNodeControls:
    """FakeRuntime's side of the nodes: the NodeRuntime protocol, and the test's controls."""

    _shared: Shared

    @property
    def replicas(self) -> dict[str, FakeReplica]:
        raise NotImplementedError

    def crash(self, tag: str, reason: str = "crashed") -> None:
        raise NotImplementedError

    def _lost_with_node(self, tag: str, node: str, reason: str) -> None:
        raise NotImplementedError

    def tags(self, state: FakeState | None = None, *, backend: str | None = None) -> list[str]:
        raise NotImplementedError

    async def nodes(self) -> Sequence[NodeInfo]:
        await trio.lowlevel.checkpoint()
        cluster = self._shared.cluster
        return [] if cluster is None else cluster.infos()

    def cordon(self, nodes: frozenset[str]) -> None:
        if self._shared.cluster is not None:
            self._cluster().cordoned = frozenset(nodes)

    @property
    def cordoned(self) -> frozenset[str]:
        """The nodes the controller asked to start nothing on."""
        return frozenset(self._cluster().cordoned)

    def add_node(self, node: str, labels: Mapping[str, str] | None = None) -> None:
        """A node joins (with the capacity of the first node given)."""
        cluster = self._cluster()
        cluster.add(node, labels or {}, self._shared.nodes[0])
        self._nodes_changed()

    def lose_node(self, node: str) -> None:
        """A node dies: every live replica on it dies too, and the controller is told."""
        self._cluster().by_id[node].alive = False
        for replica in list(self.replicas.values()):
            if replica.node == node and replica.state is not FakeState.DEAD:
                self._lost_with_node(replica.tag, node, f"its node {node} died")
        self._nodes_changed()

    def notice_drain(self, node: str, deadline: float | None = None) -> None:
        """The cluster announces that `node` goes (at `deadline`, wall clock), as Ray's drain
        and preemption notices do; nothing is stopped by it."""
        fake = self._cluster().by_id[node]
        fake.draining, fake.deadline = True, deadline
        self._nodes_changed()

    def on_node(self, node: str, *, backend: str | None = None) -> list[str]:
        """The live replicas on `node` (of `backend`)."""
        return [
            tag
            for tag in self.tags(backend=backend)
            if self.replicas[tag].node == node and self.replicas[tag].state is not FakeState.DEAD
        ]

    def _cluster(self) -> FakeNodes:
        cluster = self._shared.cluster
        if cluster is None:
            raise RuntimeError("this FakeRuntime has no nodes: give it nodes={...}")
        assert isinstance(cluster, FakeNodes)
        return cluster

    def _nodes_changed(self) -> None:
        for listener in list(self._shared.listeners):
            tell_nodes_changed(listener)
