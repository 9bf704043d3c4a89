"""What the backends of one controller share, and how each tells the controller of itself."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs

from .._model.decisions.policy import RestartPolicy
from .._model.records.revisions import Outcome
from .._ports.runtime import Runtime
from .._ports.store import Store
from .observe import Observer
from .turns import Turns
from .watch import SnapshotHub


class Member(Protocol):
    """A backend as the controller is told of it once it is gone (which one: a backend of the
    same name may have come since)."""

    @property
    def name(self) -> str: ...


@attrs.define
class Nodes:
    """What the backends read of the nodes at each pass (the node desk's to write)."""

    evict: frozenset[str] = frozenset()
    """Nodes being drained: replace their replicas elsewhere, then stop them."""
    evict_now: frozenset[str] = frozenset()
    """Nodes whose drain deadline passed: stop their replicas now."""
    cordoned: frozenset[str] = frozenset()
    """Every node that takes no new replica (cordoned, draining, or announced to go)."""


@attrs.frozen
class Shared:
    """What the backends of one controller share, and how each tells the controller of itself."""

    runtime: Runtime
    store: Store
    hub: SnapshotHub
    policy: RestartPolicy
    rng: random.Random
    observer: Observer
    requested: Callable[[str], int]
    """The generation last asked of a name: a deleted backend is forgotten only if still that."""
    room: Callable[[str, int], Awaitable[int]]
    """How many of so many replicas of a backend fit on the runtime beside the others."""
    on_pass: Callable[[], None]
    on_forgotten: Callable[[Member], None]
    roll_back: Callable[[str, int], None]
    """Undo a backend's failed revision (given) to its last good one, in the controller's
    nursery (the spec is the controller's to write)."""
    report_outcome: Callable[[str, Outcome], None]
    """How a backend's rollout goes, told to the desk, the one writer of its revision book."""
    on_promoted: Callable[[str], None] = lambda name: None
    """A backend's canary was promoted (its application's other members follow)."""
    canary_phase: Callable[[str], str] = lambda name: "off"
    """Another backend's canary phase, read by a canary that ``follows`` it."""
    nodes: Nodes = attrs.field(factory=lambda: Nodes())
    """The nodes being drained, as the node desk last said."""
    turns: Turns = attrs.field(factory=Turns)
    """Taken before each pass and after each write, so that what wakes thousands of backends
    at once does not hold the loop for seconds."""
