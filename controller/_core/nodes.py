"""The node desk: which nodes take no new replicas (cordoned) and which are being emptied
(draining), from what users asked (stored under ``node/<id>``) and what the runtime announced
(Ray's drain and preemption notices); it tells the runtime where not to place, and the backends
which nodes to move off.

A drain is carried out by every backend's own pass (``reconcile``: make before break, within
its ``max_unavailable``); the desk only says which nodes, and, once a drain's deadline passes,
that what is left there stops now. Its one task sleeps until the earliest deadline or a change:
it never polls.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import cast, final

import trio

from .._backend.loop import Backend
from .._backend.shared import Nodes
from .._clock import wall_now
from .._model.config.nodes import NODE_PREFIX, Cordon, NodeInfo, NodeRow, node_id
from .._model.values.errors import ConfigError, NodesUnsupportedError, UnknownNodeError
from .._model.values.numbers import MAX_SECONDS
from .._ports.runtime import NodeRuntime, Runtime, node_runtime
from .._ports.store import Store

logger = logging.getLogger("controller")


@final
class NodeDesk:
    def __init__(
        self,
        runtime: Runtime,
        store: Store,
        backends: Mapping[str, Backend],
        state: Nodes,
    ):
        self._runtime = runtime
        self._store = store
        self._backends = backends
        self._state = state
        self._cordons: dict[str, Cordon] = {}
        self._due: dict[str, float] = {}
        """Per drain with a deadline: when it falls due, in trio time."""
        self._forced: set[str] = set()
        self._notices: dict[str, NodeInfo] = {}
        """The runtime's nodes as last read (for their drain notices)."""
        self._lock = trio.Lock()
        self._wake = trio.Event()
        self._placeable: frozenset[str] = frozenset()
        """The nodes that took new replicas at the last look: one more, and the starts that
        no node would take are tried again at once."""

    @property
    def supported(self) -> bool:
        return node_runtime(self._runtime) is not None

    # -- from recovery and the runtime --

    def restore(self, items: Mapping[str, str]) -> None:
        """Take the cordons stored (before the backends run, so that their first pass knows)."""
        for key, text in items.items():
            if key.startswith(NODE_PREFIX):
                try:
                    cordon = Cordon.from_json(key, text)
                except ValueError as exc:
                    logger.warning("%s; ignored (node uncordon deletes it)", exc)
                    continue
                self._take(cordon)
        self._apply()

    def nodes_changed(self) -> None:
        """The runtime's nodes changed (a death, a drain notice): read them again soon."""
        self._wake.set()

    async def run(self) -> None:
        """Read the runtime's nodes at each change; force the drains whose deadline passes."""
        while True:
            self._wake = trio.Event()
            if self.supported:
                try:
                    self._notices = {n.id: n for n in await self._nodes()}
                except Exception:
                    logger.exception("reading the runtime's nodes")
            now = trio.current_time()
            for node, due in list(self._due.items()):
                if due <= now:
                    del self._due[node]
                    if node in self._cordons:
                        self._forced.add(node)
                        logger.warning("node %s: its drain's deadline passed", node)
            self._apply()
            with trio.move_on_at(min(self._due.values(), default=math.inf)):
                await self._wake.wait()

    # -- what users ask --

    async def drain(self, name: str, deadline_s: float | None = None) -> NodeRow:
        """Move every replica off node `name` (make before break), and place nothing new there
        until ``uncordon``. After `deadline_s`, what is left stops whatever the budgets say."""
        if deadline_s is not None and (
            isinstance(deadline_s, bool)
            or not isinstance(deadline_s, (int, float))
            or not 0 < deadline_s <= MAX_SECONDS
        ):
            raise ConfigError(
                "deadline_s", f"must be a number of seconds in (0, {MAX_SECONDS:g}]", deadline_s
            )
        return await self._set(name, "draining", deadline_s)

    async def cordon(self, name: str) -> NodeRow:
        """Place nothing new on node `name`; what runs there stays."""
        return await self._set(name, "cordoned", None)

    async def uncordon(self, name: str) -> NodeRow:
        """Node `name` takes replicas again (a drain under way ends; nothing moves back)."""
        async with self._lock:
            node = await self._resolve(name, known=self._cordons)
            if node in self._cordons:
                await self._store.write({NODE_PREFIX + node: None})
                del self._cordons[node]
                self._due.pop(node, None)
                self._forced.discard(node)
                logger.info("node %s uncordoned", node)
                self._apply()
            return self._row(node, self._counts().get(node, {}))

    async def rows(self) -> list[NodeRow]:
        """Every node the runtime knows, and those cordoned it no longer does."""
        if not self.supported:
            raise NodesUnsupportedError(
                "this controller's runtime has no nodes to tell apart (one machine): node "
                "commands need a runtime of several nodes, such as RayRuntime"
            )
        self._notices = {n.id: n for n in await self._nodes()}
        counts = self._counts()
        ids = list(self._notices) + sorted(set(self._cordons) - set(self._notices))
        return [self._row(node, counts.get(node, {})) for node in ids]

    # -- internals --

    async def _set(self, name: str, state: str, deadline_s: float | None) -> NodeRow:
        async with self._lock:
            node = await self._resolve(name)
            held = self._cordons.get(node)
            if state == "cordoned" and held is not None:
                # Cordoned already, or more: a drain goes on (uncordon ends it).
                return self._row(node, self._counts().get(node, {}))
            wall = wall_now()
            cordon = Cordon(node, state, wall, None if deadline_s is None else wall + deadline_s)
            await self._store.write({NODE_PREFIX + node: cordon.to_json()})
            self._forced.discard(node)
            self._take(cordon)
            logger.info(
                "node %s %s%s", node, state,
                "" if deadline_s is None else f" (deadline in {deadline_s:g}s)",
            )  # fmt: skip
            self._apply()
            self._wake.set()  # a new deadline to sleep toward
            return self._row(node, self._counts().get(node, {}))

    def _take(self, cordon: Cordon) -> None:
        self._cordons[cordon.node] = cordon
        self._due.pop(cordon.node, None)
        if cordon.state == "draining" and cordon.deadline is not None:
            left = cordon.deadline - wall_now()
            if left <= 0:
                self._forced.add(cordon.node)
            else:
                self._due[cordon.node] = trio.current_time() + left

    async def _nodes(self) -> Sequence[NodeInfo]:
        # Only asked when `supported` says the runtime has it.
        return await cast(NodeRuntime, self._runtime).nodes()

    async def _resolve(self, name: str, known: Mapping[str, object] = {}) -> str:
        """The node `name` names: an id, a unique prefix of one, or a unique address."""
        if not self.supported:
            await self.rows()  # raises
        name = node_id(name)
        self._notices = {n.id: n for n in await self._nodes()}
        ids = set(self._notices) | set(known)
        if name in ids:
            return name
        matches = [n for n in ids if n.startswith(name)]
        matches += [n.id for n in self._notices.values() if n.address == name]
        if len(set(matches)) == 1:
            return matches[0]
        listed = ", ".join(sorted(ids)[:8]) or "none"
        if matches:
            raise UnknownNodeError(
                f"node {name!r} is ambiguous: it could be {sorted(set(matches))}"
            )
        raise UnknownNodeError(f"the runtime has no node {name!r} (its nodes: {listed})")

    def _apply(self) -> None:
        """Tell the runtime where not to place, and the backends what to move off."""
        noticed = {n.id for n in self._notices.values() if n.draining and n.alive}
        draining = {n for n, c in self._cordons.items() if c.state == "draining"} | noticed
        forced = frozenset(self._forced & draining)
        evict = frozenset(draining - forced)
        cordoned = frozenset(self._cordons) | evict | forced
        runtime = node_runtime(self._runtime)
        if runtime is not None:
            runtime.cordon(cordoned)
        state = self._state
        state.cordoned = cordoned
        moved = (evict, forced) != (state.evict, state.evict_now)
        state.evict, state.evict_now = evict, forced
        # A node that takes replicas now and did not (uncordoned, or joined): a start refused
        # for want of one goes at once, not after its backoff.
        placeable = frozenset(n.id for n in self._notices.values() if n.alive) - cordoned
        freed = not placeable <= self._placeable
        self._placeable = placeable
        if moved or freed:
            for backend in list(self._backends.values()):
                backend.notify_nodes()

    def _counts(self) -> dict[str, dict[str, int]]:
        counts: dict[str, dict[str, int]] = {}
        for name, backend in self._backends.items():
            for replica in backend.replicas.values():
                if replica.node is not None:
                    per = counts.setdefault(replica.node, {})
                    per[name] = per.get(name, 0) + 1
        return counts

    def _row(self, node: str, replicas: Mapping[str, int]) -> NodeRow:
        info = self._notices.get(node)
        cordon = self._cordons.get(node)
        alive = info.alive if info is not None else False
        notice = info is not None and info.draining
        draining = notice or (cordon is not None and cordon.state == "draining")
        if not alive:
            state = "dead"
        elif draining:
            state = "draining" if any(replicas.values()) else "drained"
        elif cordon is not None:
            state = "cordoned"
        else:
            state = "ready"
        deadline = cordon.deadline if cordon is not None else None
        if deadline is None and info is not None:
            deadline = info.deadline
        return NodeRow(
            node,
            info.address if info is not None else "",
            alive,
            state,
            dict(info.labels) if info is not None else {},
            dict(sorted(replicas.items())),
            cordon.since if cordon is not None else None,
            deadline,
            notice,
        )
