"""The states a replica moves through and the frozen views the controller hands out."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from typing import Literal

import attrs

from ..config.autoscaling import AutoscalingConfig
from ..config.config import BackendConfig
from ..config.replica_config import ReplicaConfig
from ..decisions.autoscale import ScaleDecision
from ..decisions.canary_steps import CanaryStatus
from ..decisions.verdict import RequestTally
from ..records.code_report import BatchNumbers
from ..records.multiplexing import Held, ReplicaModels
from ..records.replica_state import ReplicaState
from .serving import ServingReplica, ServingReplicas


class BackendState(enum.Enum):
    """What a backend is doing, as ``status(name).state`` reports it."""

    #: Every replica of the target version runs, as configured.
    HEALTHY = "HEALTHY"
    #: Moving to a new version or user config.
    UPDATING = "UPDATING"
    #: Starting replicas to reach a larger `num_replicas`.
    UPSCALING = "UPSCALING"
    #: Stopping replicas to reach a smaller `num_replicas`.
    DOWNSCALING = "DOWNSCALING"
    #: It had reached its goal, and has since lost replicas (crashes, failed health checks).
    UNHEALTHY = "UNHEALTHY"
    #: Replicas of the new version keep failing to start; no new start until the next deploy.
    DEPLOY_FAILED = "DEPLOY_FAILED"
    #: Being deleted.
    DELETING = "DELETING"


#: Why a backend is in its state, in one word (the message says it in a sentence).
BackendReason = Literal[
    "Converged",
    "NewVersion",
    "NewUserConfig",
    "ScaleUp",
    "ScaleDown",
    "Recovering",
    "ReplicaFailures",
    "StartFailures",
    "Infeasible",
    "ReconfigureFailed",
    "ProgressDeadlineExceeded",
    "UnhealthyAfterReady",
    "CanaryAborted",
    "Canary",
    "Undo",
    "RollingBack",
    "Deleting",
]


@attrs.frozen
class BackendEvent:
    """One notable thing that happened to a backend (like an event in ``kubectl describe``)."""

    time: float
    """When, on the trio clock (events kept from before a restart are put on today's clock)."""
    kind: str
    """What kind of thing: ``Deploy``, ``Scale``, ``StartFailed``, ``Died``, ``Unhealthy``..."""
    message: str
    """What happened, in words."""
    wall_time: float | None = None
    """When, by the wall clock (seconds since the epoch), for people to read."""


#: An error as the controller words a replica's (``ReplicaError.summary``): ``Type: message``.
#: A reason without an exception's name (``worker process killed by SIGKILL``) does not match.
_SUMMARY = re.compile(r"([A-Za-z_][\w.]*): (.*)", re.DOTALL)


@attrs.frozen
class FailedStart:
    """A replica whose start failed, as status reports it until the backend is healthy again.
    The replica itself is gone; its log, where the runtime keeps logs, is kept under its tag."""

    tag: str
    """The replica (its kept log's name)."""
    version: str
    """The version it was to run."""
    error: str
    """What went wrong, as ``last_error`` says it: ``ValueError: bad port``."""
    traceback: str | None
    """The replica's own traceback, where its runtime reported one."""
    wall_time: float
    """When, by the wall clock (seconds since the epoch)."""

    @property
    def error_type(self) -> str | None:
        """The exception's name (``ValueError``), if `error` names one."""
        found = _SUMMARY.fullmatch(self.error)
        return None if found is None else found[1]

    @property
    def message(self) -> str:
        """`error` without the exception's name."""
        found = _SUMMARY.fullmatch(self.error)
        return self.error if found is None else found[2]


class GoalOutcome(enum.Enum):
    """How a goal ended."""

    #: The backend reached what the call asked for.
    COMPLETED = "COMPLETED"
    #: A later deploy or delete of the same backend replaced this goal before it was reached.
    SUPERSEDED = "SUPERSEDED"
    #: It will not be reached: ``Goal.exception`` says why (``wait`` raises it).
    FAILED = "FAILED"


def _serving(replicas: Iterable[ServingReplica]) -> ServingReplicas:
    return replicas if isinstance(replicas, ServingReplicas) else ServingReplicas(replicas)


@attrs.frozen
class TrafficSplit:
    """A canary release's share of a backend's requests, as the ingresses are told it: a
    request goes to the canary's replicas with `weight` percent chance (or as a sticky hash or
    a forcing header says), else to the stable revision's."""

    canary_version: str
    stable_version: str
    weight: float
    """Percent, 0 to 100 (0: an aborted canary whose replicas are on their way out)."""


@attrs.frozen
class BackendSnapshot:
    """What watchers (routers) need of a backend. A newer snapshot has a larger `snapshot_id`."""

    name: str
    """The backend."""
    snapshot_id: int
    """Grows with every change a watcher should see; compare to skip stale snapshots."""
    backend_config: BackendConfig | None
    """The config the backend is moving to; None once it is deleted (or was never deployed)."""
    replica_config: ReplicaConfig | None
    """How its replicas are built; None once it is deleted."""
    replicas: ServingReplicas = attrs.field(converter=_serving)
    """The replicas that serve now, in no particular order (each once, by its tag). Read it as
    a tuple (it compares equal to one); a new snapshot shares most of it with the one before,
    so publishing one costs the controller the same in a backend of 10 or 10,000 replicas."""
    deleting: bool = False
    """Its delete was asked for: its replicas are draining. It keeps no route: a backend
    deployed meanwhile may take it."""
    traffic: TrafficSplit | None = None
    """A canary release's split of the requests (None: every serving replica alike)."""
    version: str = ""
    """The version its replicas move to (``gen-N`` when the config names none): in a rolling
    update, the replicas of this version are the new ones, the others the old."""
    held: Mapping[str, Held] = attrs.field(factory=dict)
    """What each multiplexed replica that serves holds, by its latest load report: where a
    router that has not heard from it yet sends a model's requests."""

    @property
    def exists(self) -> bool:
        """False for a deleted (or never deployed) backend."""
        return self.backend_config is not None


@attrs.frozen
class ReplicaStatus:
    """One replica, as ``status()`` reports it."""

    tag: str
    """The replica's stable name (``backend#hex``)."""
    state: ReplicaState
    """Where it is in its life."""
    version: str
    """Its code version (``gen-N`` when the backend's config names none)."""
    address: str | None
    """Where it listens, once the runtime has said."""
    healthy: bool = True
    """False while its latest health check failed."""
    pid: int | None = None
    """Its process id, where the runtime has one."""
    node: str | None = None
    """The machine or cluster node it runs on, where the runtime says."""
    created_at: float | None = None
    """When the controller asked for it, by the wall clock (seconds since the epoch)."""


@attrs.frozen
class LoadReport:
    """What one ingress (or any router) holds for one backend right now: what it sends to
    replicas, and what waits in its queue. The controller keeps the latest report of each
    `source` for `LOAD_TTL_S`: a source that goes quiet stops counting."""

    source: str
    """Who reports: one id per ingress process."""
    backend: str
    """The backend the load is for."""
    in_flight: Mapping[str, int]
    """Requests sent and not yet answered, by replica tag (replicas with none may be left out)."""
    queued: int = 0
    """Requests waiting at the ingress for a replica to have room."""
    traffic: Mapping[str, RequestTally] = attrs.field(factory=dict)
    """During a canary release: what the source counted since its last report for each
    revision, by replica version (requests, errors, answer times)."""


#: How long a load report counts. Reports are sent on change; a source whose load is not zero
#: sends its report again every third of this, so that one that dies stops counting.
LOAD_TTL_S = 30.0


@attrs.frozen
class BackendNumbers:
    """A backend's counts for a chart: cheap to take (no replica is walked), unlike a status."""

    name: str
    desired: int
    """As ``BackendStatus.desired_replicas``."""
    ready: int
    """Replicas serving (as ``BackendStatus.ready``)."""
    in_flight: int
    queued: int


@attrs.frozen
class BackendLoad:
    """The load of one backend, summed over the sources that reported within `LOAD_TTL_S`."""

    in_flight: int
    """Requests on their way to or in replicas."""
    queued: int
    """Requests waiting at ingresses for a replica to have room."""
    replicas: Mapping[str, int]
    """In flight per replica tag (those with none are left out)."""
    sources: int
    """How many sources reported."""
    self_reported: int = 0
    """What the replicas say they hold, summed (from their ``load()``, where they have one)."""
    served: Mapping[str, int] = attrs.field(factory=dict)
    """Requests each replica has answered, by its own count (code the worker serves: a
    function, a callable class, an ASGI app; others are left out)."""
    models: Mapping[str, ReplicaModels] = attrs.field(factory=dict)
    """What each multiplexed replica holds (``@controller.multiplexed``), by its own word."""
    batches: Mapping[str, tuple[BatchNumbers, ...]] = attrs.field(factory=dict)
    """Each replica's batched functions (``@controller.batch``): their batches, sizes and
    waits, by its own count."""

    @property
    def ongoing(self) -> int:
        """In flight (as the ingresses or the replicas themselves count it, whichever is more)
        plus queued: what the autoscaler divides by the replicas."""
        return max(self.in_flight, self.self_reported) + self.queued


@attrs.frozen
class AutoscalerStatus:
    """An autoscaled backend's autoscaler, as status reports it."""

    config: AutoscalingConfig
    """Its bounds, target load and pace."""
    target: int
    """The replica count it set."""
    last: ScaleDecision | None
    """Its latest evaluation: the load it saw, what it recommended, what it set, and why
    (None before the first)."""
    last_change: ScaleDecision | None = None
    """Its latest evaluation that changed the count (None if none has yet)."""
    capped_at: int | None = None
    """Set when the runtime fits fewer replicas than `target`: the most that fit, which is what
    the backend works toward meanwhile (asked again on the next change, and every second)."""


@attrs.frozen
class RolloutStatus:
    """A backend's rollouts, as status reports them."""

    revision: int | None
    """The revision it rolls out, or runs once that is complete (the target)."""
    current_revision: int | None
    """The newest revision whose rollout completed (what it last finished rolling out)."""
    outcome: str | None
    """How the rollout of `revision` goes: ``in_progress``, ``complete`` or ``failed``."""
    paused: bool = False
    """Later deploys are recorded, not rolled out, until a resume."""
    pending_revision: int | None = None
    """While paused: the revision a resume rolls out."""
    error: str | None = None
    """Why the rollout of `revision` failed, if it did."""
    restores: int | None = None
    """`revision` came from an undo or a rollback: the revision whose content it brings back."""
    automatic: bool = False
    """`revision` came from an automatic rollback."""
    canary: CanaryStatus | None = None
    """`revision`'s canary release, while it is under way (and once it ended, until the next
    spec)."""


@attrs.frozen
class BackendStatus:
    """A backend, as ``status(name)`` reports it."""

    name: str
    """The backend."""
    state: BackendState
    """What it is doing."""
    reason: BackendReason
    """Why, in one word."""
    message: str
    """What it is doing, in words: ``"2/5 replicas of version b running; 3 starting"``."""
    generation: int
    """How many times its spec was changed (deploy or delete)."""
    observed_generation: int
    """The generation the controller has acted on (lags `generation` only for a moment)."""
    backend_config: BackendConfig
    """The config it is moving to."""
    replica_config: ReplicaConfig
    """How its replicas are built."""
    deleting: bool
    """True once a delete was asked for."""
    goal_done: bool
    """True when the latest goal is reached (or failed)."""
    last_error: str | None
    """The most recent replica failure, as ``Type: message``, until it is healthy again."""
    replicas: tuple[ReplicaStatus, ...]
    """Every replica the controller holds for it, by tag."""
    events: tuple[BackendEvent, ...]
    """Its recent events, oldest first (kept across controller restarts)."""
    last_traceback: str | None = None
    """The replica's own traceback of `last_error`, where its runtime reported one."""
    load: BackendLoad = attrs.field(factory=lambda: BackendLoad(0, 0, {}, 0))
    """What the ingresses report sending to it and holding for it."""
    version: str = ""
    """The version its replicas must have: the config's, or ``gen-N`` when it names none."""
    desired: int | None = None
    """The replica count it moves to: the autoscaler's, or `num_replicas` (None: read that)."""
    autoscaler: AutoscalerStatus | None = None
    """Its autoscaler, if it is autoscaled."""
    rollout: RolloutStatus | None = None
    """Its revisions and their rollout."""
    failed_starts: tuple[FailedStart, ...] = ()
    """Its latest failed starts, oldest first, until it is healthy again (left out of a
    summary, as `replicas` are)."""
    tally: Mapping[tuple[str, ReplicaState], int] | None = None
    """Set when `replicas` and `events` were left out (``Controller.summary``): how many
    replicas of each version are in each state, which `counts_by_version` then reads."""
    serving: Mapping[str, int] = attrs.field(factory=dict)
    """How many replicas of each version serve: those listed to routers (ready, healthy and
    not stopping; after a restart, also those that served and are being adopted). A replica
    whose health check failed is left out until one passes."""

    @property
    def ready(self) -> int:
        """How many replicas serve (READY in ``controller status``)."""
        return sum(self.serving.values())

    @property
    def desired_replicas(self) -> int:
        """The replica count it moves to (0 once deleting)."""
        if self.deleting:
            return 0
        return self.backend_config.num_replicas if self.desired is None else self.desired

    @property
    def counts(self) -> Mapping[ReplicaState, int]:
        """How many replicas are in each state."""
        out: dict[ReplicaState, int] = {}
        for (_, state), n in self.counts_by_version.items():
            out[state] = out.get(state, 0) + n
        return out

    @property
    def counts_by_version(self) -> Mapping[tuple[str, ReplicaState], int]:
        """How many replicas of each version are in each state."""
        if self.tally is not None:
            return self.tally
        out: dict[tuple[str, ReplicaState], int] = {}
        for replica in self.replicas:
            key = (replica.version, replica.state)
            out[key] = out.get(key, 0) + 1
        return out


@attrs.frozen
class ControllerStatus:
    """Every backend the controller holds."""

    backends: tuple[BackendStatus, ...]
    """Sorted by name."""

    def __getitem__(self, name: str) -> BackendStatus:
        for backend in self.backends:
            if backend.name == name:
                return backend
        raise KeyError(name)
