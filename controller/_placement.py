"""Feasibility: can replicas, each needing some resources, be placed on a runtime's nodes?"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def count_fitting(
    nodes: Sequence[Mapping[str, float]],
    held: Sequence[tuple[Mapping[str, float], int]],
    wanted: Mapping[str, float],
    count: int,
) -> int:
    """How many of `count` new replicas needing `wanted` fit beside what is already `held`.

    Placement is first-fit decreasing, one replica at a time onto one node each: a replica needing
    2 CPUs does not fit on two nodes with 1 free each. `held` lists (resources, how many).
    """
    free = [dict(node) for node in nodes]
    items = sorted(held, key=lambda item: sum(item[0].values()), reverse=True)
    for resources, n in items:
        for _ in range(n):
            # What is already held was placed by someone; if our packing cannot reproduce it, count
            # it against whichever node has room so that the new replicas are not over-promised.
            if not _place(free, resources):
                _take_anyway(free, resources)
    placed = 0
    while placed < count and _place(free, wanted):
        placed += 1
    return placed


def _place(free: list[dict[str, float]], need: Mapping[str, float]) -> bool:
    for node in free:
        if all(node.get(key, 0.0) >= amount for key, amount in need.items()):
            for key, amount in need.items():
                node[key] = node.get(key, 0.0) - amount
            return True
    return False


def _take_anyway(free: list[dict[str, float]], need: Mapping[str, float]) -> None:
    for key, amount in need.items():
        node = max(free, key=lambda n: n.get(key, 0.0))
        node[key] = node.get(key, 0.0) - amount


def total(nodes: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The sum of each resource over `nodes`."""
    out: dict[str, float] = {}
    for node in nodes:
        for key, amount in node.items():
            out[key] = out.get(key, 0.0) + amount
    return out
