"""LocalRuntime's one node, this machine: listed by ``controller node list`` with its replicas,
and cordoned or drained like any node. With nowhere else to go, a drained machine keeps its
replicas until the drain's deadline; a cordoned one starts none (``Unschedulable``) until it is
uncordoned."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from .._model.config.nodes import NodeInfo
from .._model.values.errors import ReplicaError


class OneNode:
    """The NodeRuntime side of LocalRuntime."""

    _node: str
    _cordoned: frozenset[str] = frozenset()

    async def nodes(self) -> Sequence[NodeInfo]:
        await trio.lowlevel.checkpoint()
        return [NodeInfo(self._node, "127.0.0.1")]

    def cordon(self, nodes: frozenset[str]) -> None:
        self._cordoned = frozenset(nodes)

    def check_placeable(self, tag: str) -> None:
        """Raise for a start while this machine takes no new replica."""
        if self._node in self._cordoned:
            raise ReplicaError(
                tag,
                "Unschedulable",
                f"this machine (node {self._node}) is cordoned or drained: `controller node "
                f"uncordon {self._node}` lets replicas start here again",
            )
