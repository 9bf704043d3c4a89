"""What tasks and the runtime tell a backend's reconcile loop. Tasks report; the loop writes."""

from __future__ import annotations

from typing import TypeAlias

import attrs

from ._runtime import ReplicaInfo


@attrs.frozen
class Started:
    """A start or adoption finished: the replica is ready."""

    tag: str
    info: ReplicaInfo


@attrs.frozen
class StartFailed:
    """A start failed or timed out; the task already killed what was left. (A failed adoption
    reports ``Stopped``: it is not the new version failing to start.)"""

    tag: str
    error: str
    traceback: str | None = None
    """The user's traceback, where the runtime reported one."""


@attrs.frozen
class Stopped:
    """A replica is gone (drained and/or killed)."""

    tag: str


@attrs.frozen
class Died:
    """The runtime saw a replica die on its own."""

    tag: str
    reason: str


@attrs.frozen
class Reconfigured:
    """A reconfigure call returned; `error` is set if the user's code raised."""

    tag: str
    config_digest: str
    error: str | None


@attrs.frozen
class HealthChecked:
    """A health check returned; `error` is set if it failed or timed out."""

    tag: str
    error: str | None


@attrs.frozen
class Tick:
    """The backend's timer fired: a health check or the end of a backoff is due."""

    at: float
    """The time it was armed for (a tick of a timer since replaced is ignored)."""


@attrs.frozen
class Written:
    """The backend's replica record, as of change number `seq`, is durable."""

    seq: int


@attrs.frozen
class SpecChanged:
    """A deploy or delete changed the backend's spec."""


Event: TypeAlias = (
    Started
    | StartFailed
    | Stopped
    | Died
    | Reconfigured
    | HealthChecked
    | Tick
    | Written
    | SpecChanged
)
