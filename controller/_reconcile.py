"""The decision step: given what a backend should be and what its replicas are, what to do now.

A pure function: no I/O, no clock, no trio. The backend task applies events to its replicas, asks
``decide`` for a plan, checkpoints the plan's intent, then carries it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

from ._state import ReplicaState


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
    # Runs on every event, over every replica of the backend: single passes and identity
    # checks on the states (an Enum's hash is Python code; `in frozenset` would call it).
    running, updating, stopping = ReplicaState.RUNNING, ReplicaState.UPDATING, ReplicaState.STOPPING
    current: list[ReplicaView] = []
    old: list[ReplicaView] = []
    any_stopping = False
    for r in replicas:
        if r.state is stopping:
            any_stopping = True
        elif r.version == target.version:
            current.append(r)
        else:
            old.append(r)
    if target.deleting:
        return Plan(stop=tuple(r.tag for r in stop_order(current + old)), converged=not replicas)

    stop: list[str] = []
    start = 0
    excess = len(current) - target.num_replicas
    if excess > 0:
        ordered = stop_order(current)
        stop.extend(r.tag for r in ordered[:excess])
        current = ordered[excess:]
    elif excess < 0 and not target.starts_blocked:
        start = -excess

    serving_new = 0
    reconfigure: list[str] = []
    all_up_to_date = True
    for r in current:
        if r.state is running:
            serving_new += 1
            if r.config_digest != target.config_digest:
                reconfigure.append(r.tag)
                all_up_to_date = False
        else:
            all_up_to_date = False
            if r.state is updating:
                serving_new += 1

    # Old-version replicas keep serving until enough new ones do: replacement never drops
    # capacity below what the target asks, even when the new version cannot start.
    keep_old = max(0, target.num_replicas - serving_new)
    if len(old) > keep_old:
        stop.extend(r.tag for r in stop_order(old)[: len(old) - keep_old])

    converged = (
        all_up_to_date
        and not any_stopping
        and not old
        and not stop
        and start == 0
        and len(current) == target.num_replicas
    )
    return Plan(start=start, stop=tuple(stop), reconfigure=tuple(reconfigure), converged=converged)
