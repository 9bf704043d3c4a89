"""The replicas of a watch snapshot: an immutable sequence that a change copies a few small
nodes of, not every replica.

A backend publishes a snapshot on every change of the replicas that serve. Were each snapshot
a tuple of them, a crash in a backend of 10,000 replicas would copy 10,000 references twice
(one snapshot without the dead replica, one with its replacement), and the controller's
reaction would slow as backends grow. Here the replicas are the leaves of a trie of tuples,
32 wide (a persistent vector): a new snapshot shares every node but the few on the path to
the one position that changed, about log32(n) tuples of at most 32 (3 at 10,000 replicas).
Reading it is as reading a tuple: ``len``, iteration, indexing, ``in``, equality with a tuple.

Pure: no trio, no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, final, overload

import attrs

_BITS = 5
_WIDTH = 1 << _BITS
_MASK = _WIDTH - 1

# A node is a tuple: at depth 0 (`shift` 0) of items, above of child nodes. The tree is packed
# to the left: every node is full but those on the path to the last item.
_Node = tuple[Any, ...]


@attrs.frozen
class ServingReplica:
    """One replica in a watch snapshot: where a router may send requests."""

    tag: str
    """The replica's stable name."""
    version: str
    """Its code version."""
    address: str | None
    """Where it listens, as its runtime reports it (None if the runtime has no such notion)."""


@final
class ServingReplicas(Sequence[ServingReplica]):
    """An immutable sequence of ``ServingReplica``, in no particular order. Each change
    (``replaced``, ``appended``, ``without_last``) makes a new one in O(log n) that shares
    the rest with this one; this one is unchanged."""

    __slots__ = ("_root", "_shift", "_size")

    _root: _Node
    _shift: int
    _size: int

    def __init__(self, items: Iterable[ServingReplica] = ()) -> None:
        nodes: list[_Node] = []
        chunk: list[ServingReplica] = []
        for item in items:
            chunk.append(item)
            if len(chunk) == _WIDTH:
                nodes.append(tuple(chunk))
                chunk = []
        if chunk:
            nodes.append(tuple(chunk))
        size = (len(nodes) - 1) * _WIDTH + len(nodes[-1]) if nodes else 0
        shift = 0
        while len(nodes) > 1:
            nodes = [tuple(nodes[i : i + _WIDTH]) for i in range(0, len(nodes), _WIDTH)]
            shift += _BITS
        self._root, self._shift, self._size = (nodes[0] if nodes else ()), shift, size

    @classmethod
    def _made(cls, root: _Node, shift: int, size: int) -> ServingReplicas:
        new = cls.__new__(cls)
        new._root, new._shift, new._size = root, shift, size
        return new

    # -- reading, as a tuple --

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, index: int) -> ServingReplica: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[ServingReplica, ...]: ...
    def __getitem__(self, index: int | slice) -> ServingReplica | tuple[ServingReplica, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        i = index + self._size if index < 0 else index
        if not 0 <= i < self._size:
            raise IndexError("ServingReplicas index out of range")
        node = self._root
        shift = self._shift
        while shift:
            node = node[(i >> shift) & _MASK]
            shift -= _BITS
        item: ServingReplica = node[i & _MASK]
        return item

    def __iter__(self) -> Iterator[ServingReplica]:
        if self._shift == 0:
            return iter(self._root)
        return itertools.chain.from_iterable(_leaves(self._root, self._shift))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ServingReplicas):
            if other._root is self._root:
                return True
        elif not isinstance(other, tuple):
            return NotImplemented
        return len(other) == self._size and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"ServingReplicas({tuple(self)!r})"

    # -- changing: each a new sequence --

    def replaced(self, index: int, item: ServingReplica) -> ServingReplicas:
        """The same with `item` at `index` (which must be a position held)."""
        if not 0 <= index < self._size:
            raise IndexError("ServingReplicas index out of range")
        return self._made(_replace(self._root, self._shift, index, item), self._shift, self._size)

    def appended(self, item: ServingReplica) -> ServingReplicas:
        """The same with `item` after the last."""
        i, shift = self._size, self._shift
        if i == _WIDTH << shift:  # full: one level more, the old root its first child
            root = (self._root, _path(shift, item))
            return self._made(root, shift + _BITS, i + 1)
        return self._made(_push(self._root, shift, i, item), shift, i + 1)

    def without_last(self) -> ServingReplicas:
        """The same without its last item."""
        if not self._size:
            raise IndexError("without_last of an empty ServingReplicas")
        root, shift = _pop(self._root, self._shift, self._size - 1), self._shift
        while shift and len(root) == 1:
            root, shift = root[0], shift - _BITS
        return self._made(root, shift, self._size - 1)

    def nodes_shared_with(self, other: ServingReplicas) -> int:
        """How many nodes (tuples) of this one `other` holds as well, by identity: what a
        change did not copy (for tests)."""
        theirs = {id(node) for node in _nodes(other._root, other._shift)}
        return sum(id(node) in theirs for node in _nodes(self._root, self._shift))

    def node_count(self) -> int:
        """How many nodes (tuples) it is made of (for tests)."""
        return sum(1 for _ in _nodes(self._root, self._shift))


def _leaves(node: _Node, shift: int) -> Iterator[_Node]:
    if shift == 0:
        yield node
        return
    for child in node:
        yield from _leaves(child, shift - _BITS)


def _nodes(node: _Node, shift: int) -> Iterator[_Node]:
    yield node
    if shift:
        for child in node:
            yield from _nodes(child, shift - _BITS)


def _replace(node: _Node, shift: int, i: int, item: Any) -> _Node:
    j = (i >> shift) & _MASK
    new = item if shift == 0 else _replace(node[j], shift - _BITS, i, item)
    return (*node[:j], new, *node[j + 1 :])


def _path(shift: int, item: Any) -> _Node:
    node: _Node = (item,)
    while shift:
        node = (node,)
        shift -= _BITS
    return node


def _push(node: _Node, shift: int, i: int, item: Any) -> _Node:
    if shift == 0:
        return (*node, item)
    j = (i >> shift) & _MASK
    if j < len(node):  # into the last child, which has room
        return (*node[:j], _push(node[j], shift - _BITS, i, item))
    return (*node, _path(shift - _BITS, item))


def _pop(node: _Node, shift: int, i: int) -> _Node:
    if shift == 0:
        return node[:-1]
    j = (i >> shift) & _MASK
    child = _pop(node[j], shift - _BITS, i)
    return (*node[:j], child) if child else node[:j]
