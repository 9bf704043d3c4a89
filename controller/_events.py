"""What tasks and the runtime tell a backend's reconcile loop. Tasks report; the loop writes."""

from __future__ import annotations

from typing import TypeAlias

import attrs


@attrs.frozen
class Started:
    """A start or adoption finished: the replica is ready."""

    tag: str
    address: str | None


@attrs.frozen
class StartFailed:
    """A start failed or timed out; the task already killed what was left. (A failed adoption
    reports ``Stopped``: it is not the new version failing to start.)"""

    tag: str
    error: str


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
class Written:
    """The backend's replica record, as of change number `seq`, is durable."""

    seq: int


@attrs.frozen
class SpecChanged:
    """A deploy or delete changed the backend's spec."""


Event: TypeAlias = Started | StartFailed | Stopped | Died | Reconfigured | Written | SpecChanged
