"""A backend's state in one sentence, for people: the status message."""

from __future__ import annotations

from collections.abc import Sequence

from ._history import plural
from ._state import ReplicaState, ReplicaStatus


def describe(
    version: str,
    desired: int,
    replicas: Sequence[ReplicaStatus],
    *,
    deleting: bool,
    failed_starts: int,
    error: str | None,
    converged: bool,
    starts_blocked: bool,
) -> str:
    """``"2/5 replicas of version b running; 1 starting; 1 failed to start: ValueError: ..."``.

    `error` is the last failure of the current generation only: a new deploy's first message
    does not show what went wrong with the one before it.
    """
    if deleting:
        return f"deleting; {plural(len(replicas), 'replica')} left"
    running = older = 0
    others: dict[str, int] = {}
    for r in replicas:
        if r.version != version and r.state is not ReplicaState.STOPPING:
            older += 1
        elif r.state is ReplicaState.RUNNING:
            running += 1
        else:
            key = r.state.value.lower()
            others[key] = others.get(key, 0) + 1
    noun = "replica" if desired == 1 else "replicas"
    parts = [f"{running}/{desired} {noun} of version {version} running"]
    parts += [f"{n} {state}" for state, n in sorted(others.items())]
    if older:
        parts.append(f"{older} of {'an older version' if older == 1 else 'older versions'}")
    unhealthy = sum(1 for r in replicas if not r.healthy)
    if unhealthy:
        parts.append(f"{unhealthy} unhealthy")
    if failed_starts:
        parts.append(f"{failed_starts} failed to start: {error}")
    elif error is not None and not converged:
        parts.append(f"last failure: {error}")
    if starts_blocked:
        parts.append("no new starts until the next deploy")
    return "; ".join(parts)
