"""What tasks, the runtime and the controller tell a backend's loop. They report; the loop writes.

Every task the loop starts reports exactly one event, whatever happens to it (but for the whole
controller closing); the loop then decides what follows, a stop included.
"""

from __future__ import annotations

from typing import TypeAlias

import attrs
import trio

from .._model.decisions.spec import Spec
from .._model.records.code_report import CodeReport
from .._model.views.status import LoadReport
from .._ports.runtime import ReplicaInfo
from .goal import Goal


@attrs.frozen
class Started:
    """A start or adoption finished: the replica is ready."""

    tag: str
    info: ReplicaInfo


@attrs.frozen
class StartFailed:
    """A start or adoption did not finish. `error` is None when its scope was cancelled (by the
    loop, which stopped it, or by the start timeout); the replica may be half-started."""

    tag: str
    error: str | None
    traceback: str | None = None
    """The user's traceback, where the runtime reported one."""


@attrs.frozen
class Stopped:
    """A replica is gone (drained and/or killed)."""

    tag: str


@attrs.frozen
class Died:
    """The runtime saw a replica die on its own, or go with its node (`node`: the node lost)."""

    tag: str
    reason: str
    node: str | None = None


@attrs.frozen
class Reconfigured:
    """A reconfigure call ended: `error` is set if the user's code raised; `cut` if its scope
    was cancelled (by the loop, or by the timeout)."""

    tag: str
    config_digest: str
    error: str | None
    cut: bool = False


@attrs.frozen
class HealthChecked:
    """Health checks ended (those of one wave that ended together): each replica's tag, and its
    error if it failed or timed out."""

    results: list[tuple[str, str | None]]


@attrs.frozen
class Tick:
    """The backend's timer fired: a health check or the end of a backoff is due."""

    at: float
    """The time it was armed for (a tick of a timer since replaced is ignored)."""


@attrs.frozen
class Written:
    """The backend's replica record, as of change number `seq`, is durable."""

    seq: int


@attrs.frozen(eq=False)
class SpecChanged:
    """A deploy or delete wrote a new spec: the loop takes it, with its goal, and sets
    `applied` once it has."""

    spec: Spec
    goal: Goal
    applied: trio.Event


@attrs.frozen
class LoadReported:
    """A source (an ingress, in this process or another) reported the backend's load, and for
    a canary each revision's numbers, at `at`. The loop is the one writer of the load book and
    of the canary's numbers: reports come to it, as every other event does."""

    report: LoadReport
    at: float


@attrs.frozen
class OwnLoad:
    """A replica's own report, through its runtime: its ``load()`` (None: it no longer says),
    the requests it has answered, and its code's models and batches."""

    tag: str
    ongoing: int | None
    served: int | None
    code: CodeReport | None


@attrs.frozen
class RoomChecked:
    """The runtime was asked how many of `wanted` replicas fit for the backend: `room` do."""

    wanted: int
    room: int


@attrs.frozen
class NodesChanged:
    """Nodes began or stopped draining: the pass reads which from the shared node state."""


@attrs.frozen(eq=False)
class CanaryCommand:
    """A person asked to promote or abort the canary release under way (`via`: how), and
    waits on `applied`."""

    what: str
    via: str
    applied: trio.Event


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
    | LoadReported
    | OwnLoad
    | RoomChecked
    | NodesChanged
    | CanaryCommand
)
