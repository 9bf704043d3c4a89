"""Feasibility: can replicas, each needing some resources, be placed on a runtime's nodes?

Pure arithmetic, no I/O. Every replica also takes one of its node's ``replica_slots`` (a runtime's
limit on how many replicas a node can hold at all, whatever they ask for), so that a replica never
costs nothing to place. Amounts are counted in ten-thousandths, as Ray does, so that 0.1 + 0.2 is
exactly 0.3 here. Placing `n` identical replicas costs O(nodes x resources), never O(n): a count of
10**18 is answered as fast as a count of 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from ..config.nodes import LABEL_PREFIX, NodeRules

#: The capacity key that counts replicas themselves: each replica takes one on its node. A node
#: whose capacity lacks it sets no limit on the count (a runtime written before it existed).
SLOTS = "replica_slots"

_UNIT = 10_000
_PLAIN = NodeRules()
#: A per-node room that is no limit (beyond any count a backend may ask for).
_NO_CAP = 1 << 62


def _units(amount: float) -> int:
    return round(amount * _UNIT)


@attrs.frozen
class Demand:
    """`count` replicas of `name`, each needing `resources` (besides its slot)."""

    name: str
    resources: Mapping[str, float]
    count: int
    why: str = ""
    """Where the count comes from, when it is not plainly what was asked (for messages)."""
    rules: NodeRules = attrs.field(factory=NodeRules)
    """Which nodes take its replicas, and how many each (the held and wanted demands of one
    name share the per-node limit)."""


def need_of(resources: Mapping[str, float]) -> dict[str, float]:
    """What one replica takes: its resources and one slot."""
    return {**resources, SLOTS: 1.0}


def place(
    nodes: Sequence[Mapping[str, float]],
    held: Sequence[Demand],
    wanted: Sequence[Demand],
) -> dict[str, int]:
    """How many replicas of each of `wanted` fit beside what is already `held`, placing the
    wanted groups in order.

    Placement is first fit, each replica whole on one node: a replica needing 2 CPUs does not
    fit on two nodes with 1 free each. What is held was placed by someone else's packing; if ours
    cannot reproduce it, it is counted against whichever node has the most of each resource, so
    that new replicas are not over-promised.
    """
    free = [{key: _units(amount) for key, amount in node.items()} for node in nodes]
    # Per name with a per-node limit: how many of its replicas each node holds so far.
    taken: dict[str, _Limit] = {}
    # Larger replicas first: first fit decreasing packs what is already there most tightly.
    for run, count in _runs(sorted(held, key=lambda d: sum(d.resources.values()), reverse=True)):
        need = {key: _units(amount) for key, amount in need_of(run.resources).items()}
        left = _fill(free, need, count, _allowed(nodes, run, taken))
        if left:
            for key, amount in need.items():
                node = max(free, key=lambda n: n.get(key, 0))
                if key in node:
                    node[key] -= amount * left
    placed: dict[str, int] = {}
    for demand in wanted:
        need = {key: _units(amount) for key, amount in need_of(demand.resources).items()}
        allowed = _allowed(nodes, demand, taken)
        placed[demand.name] = demand.count - _fill(free, need, demand.count, allowed)
    return placed


@attrs.define
class _Limit:
    """How many more replicas of one name each node may take under its rules."""

    room: list[int]

    def took(self, node: int, count: int) -> None:
        self.room[node] -= count


def _allowed(
    nodes: Sequence[Mapping[str, float]], demand: Demand, taken: dict[str, _Limit]
) -> _Limit | None:
    """The limit `demand`'s rules (its labels and per-node cap) set, shared by every demand of
    its name; None: no rule limits it."""
    rules = demand.rules
    if rules.max_per_node is None and not rules.labels:
        return None
    limit = taken.get(demand.name)
    if limit is None:
        cap = rules.max_per_node if rules.max_per_node is not None else _NO_CAP
        room = [cap if rules.admits_capacity(node) else 0 for node in nodes]
        limit = taken[demand.name] = _Limit(room)
    return limit


def _runs(demands: Sequence[Demand]) -> list[tuple[Demand, int]]:
    """Consecutive demands of the same resources as one: first fit places `a` then `b` of one
    kind exactly as it places `a + b` (the nodes the first filled have no room for the second),
    so a thousand backends of the same shape cost one fill, not a thousand. (What does not fit
    at all is then counted against one node, the one with the most, rather than possibly two.)
    A demand with node rules stands alone: its limits are its name's."""
    runs: list[tuple[Demand, int]] = []
    for demand in demands:
        last = runs[-1][0] if runs else None
        if (
            last is not None
            and demand.rules == last.rules == _PLAIN
            and last.resources == demand.resources
        ):
            runs[-1] = (last, runs[-1][1] + demand.count)
            continue
        runs.append((demand, demand.count))
    return runs


def _fill(
    free: list[dict[str, int]], need: Mapping[str, int], count: int, limit: _Limit | None = None
) -> int:
    """Place up to `count` replicas needing `need`, node by node, within `limit`; return how
    many did not fit.

    One replica at a time onto the first node with room is the same as filling each node in turn:
    a node that cannot take one more never can later, since nothing here frees resources.
    """
    left = count
    for index, node in enumerate(free):
        if left <= 0:
            break
        room = left if limit is None else min(left, limit.room[index])
        for key, amount in need.items():
            if amount <= 0 or room <= 0:
                continue
            if key not in node:
                if key == SLOTS:
                    continue  # this node sets no limit on the count
                room = 0
                break
            room = min(room, max(0, node[key]) // amount)
        if room <= 0:
            continue
        for key, amount in need.items():
            if amount > 0 and key in node:
                node[key] -= amount * room
        if limit is not None:
            limit.took(index, room)
        left -= room
    return left


def total(nodes: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The sum of each resource over `nodes` (labels are not amounts: left out)."""
    out: dict[str, float] = {}
    for node in nodes:
        for key, amount in node.items():
            if not key.startswith(LABEL_PREFIX):
                out[key] = out.get(key, 0.0) + amount
    return out
