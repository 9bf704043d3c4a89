"""The decision step: given what a backend should be and what its replicas are, what to do now.

A pure function: no I/O, no clock, no trio. The backend task applies events to its replicas, asks
``decide`` for a plan, checkpoints the plan's intent, then carries it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

from ._state import SERVING_STATES, ReplicaState


class ReplicaView(Protocol):
    """What the decision reads of one replica."""

    @property
    def tag(self) -> str: ...
    @property
    def state(self) -> ReplicaState: ...
    @property
    def version(self) -> str: ...
    @property
    def config_digest(self) -> str: ...
    @property
    def seq(self) -> int:
        """Start order within the backend: larger started later."""
        ...


@attrs.frozen
class Target:
    """What the backend should converge to."""

    num_replicas: int
    version: str
    config_digest: str
    deleting: bool = False
    starts_blocked: bool = False
    """The goal failed: start nothing new until the next deploy (the old version keeps serving)."""


@attrs.frozen
class Plan:
    """What to do now. Stops are listed in the order they should go."""

    start: int = 0
    """How many new replicas of the target version to start."""
    stop: tuple[str, ...] = ()
    reconfigure: tuple[str, ...] = ()
    """RUNNING replicas of the target version whose user config is out of date."""
    converged: bool = False
    """The backend is exactly what the target asks: nothing starting, stopping or outdated."""


# Which replicas go first when there are too many: those that serve nobody yet, then those
# whose readiness is unconfirmed, then serving ones. Ties: the most recently started first.
_STOP_RANK = {
    ReplicaState.STARTING: 0,
    ReplicaState.RECOVERING: 1,
    ReplicaState.UPDATING: 2,
    ReplicaState.RUNNING: 3,
}


def stop_order(replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    """`replicas` sorted so that the first should be stopped first."""
    return sorted(replicas, key=lambda r: (_STOP_RANK[r.state], -r.seq))


def decide(target: Target, replicas: Sequence[ReplicaView]) -> Plan:
    """The plan that moves `replicas` toward `target`."""
    active = [r for r in replicas if r.state is not ReplicaState.STOPPING]
    any_stopping = len(active) != len(replicas)
    if target.deleting:
        return Plan(stop=tuple(r.tag for r in stop_order(active)), converged=not replicas)

    current = [r for r in active if r.version == target.version]
    old = [r for r in active if r.version != target.version]
    stop: list[str] = []
    start = 0

    excess = len(current) - target.num_replicas
    if excess > 0:
        ordered = stop_order(current)
        stop.extend(r.tag for r in ordered[:excess])
        current = ordered[excess:]
    elif excess < 0 and not target.starts_blocked:
        start = -excess

    # Old-version replicas keep serving until enough new ones do: replacement never drops
    # capacity below what the target asks, even when the new version cannot start.
    serving_new = sum(1 for r in current if r.state in SERVING_STATES)
    keep_old = max(0, target.num_replicas - serving_new)
    ordered_old = stop_order(old)
    stop.extend(r.tag for r in ordered_old[: max(0, len(old) - keep_old)])

    reconfigure = tuple(
        r.tag
        for r in current
        if r.state is ReplicaState.RUNNING and r.config_digest != target.config_digest
    )
    converged = (
        not any_stopping
        and not old
        and start == 0
        and not stop
        and len(current) == target.num_replicas
        and all(
            r.state is ReplicaState.RUNNING and r.config_digest == target.config_digest
            for r in current
        )
    )
    return Plan(start=start, stop=tuple(stop), reconfigure=reconfigure, converged=converged)
