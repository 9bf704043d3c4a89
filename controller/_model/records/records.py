"""What the controller keeps in its store, record by record: a backend's spec, its replicas (in
pages), its revisions and its recent events, each under a key of its own (``spec/<name>``,
``replicas/<name>`` and ``replicas/<name>/<page>``, ``revisions/<name>``, ``events/<name>``),
with the schema version they were written in. How they become JSON and are read back, checked,
is `checkpoint`'s."""

from __future__ import annotations

from typing import Literal

import attrs

from ..config.config import BackendConfig
from ..config.replica_config import ReplicaConfig
from .revisions import Revision, RevisionOutcome

#: Bumped when the stored shape changes; a controller refuses data written by a newer one.
SCHEMA_VERSION = 9
#: Older schemas this controller still reads (their records lack fields that have defaults).
READABLE_SCHEMAS = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 9})

SPEC_PREFIX = "spec/"
REPLICAS_PREFIX = "replicas/"
EVENTS_PREFIX = "events/"
REVISIONS_PREFIX = "revisions/"
#: The largest revision number (what the API's document allows, a signed 64-bit integer).
MAX_REVISION = 2**63 - 1


@attrs.frozen
class SpecRecord:
    """A backend's spec as the user last set it."""

    name: str
    generation: int
    backend_config: BackendConfig
    replica_config: ReplicaConfig
    deleting: bool = False
    """A delete was asked for; the backend is forgotten once its replicas are gone."""
    force: bool = False
    """The delete skips the graceful drain."""
    rollback_config: str | None = None
    """For an in-place change of user config (same version): the config before it, as JSON
    text, to roll back to if the new one fails in a replica (None: nothing to roll back to)."""
    code_generation: int | None = None
    """For a config without a version: the generation whose code the replicas run (``gen-N``),
    kept by deploys that change only the scale, limits, timeouts or routing. None: this one."""
    revision: int | None = None
    """The revision its replicas run (None before schema 6: recovery makes one)."""
    paused: bool = False
    """Rollouts are paused: later deploys are recorded as revisions, not rolled out."""
    pending: int | None = None
    """While paused: the revision recorded last, to roll out on resume (None: none)."""
    applied: str | None = None
    """The fields a manifest last applied, as JSON text (None: never; before schema 8): the
    base of the next apply's merge (see ``last_applied``)."""
    restarted: int | None = None
    """For a config with a version: the generation of the ``rollout restart`` whose replicas
    these are (their version is ``<version>+restart.<N>``), kept while the replicas' content
    is the same (None: never restarted; before schema 9)."""
    schema: int = SCHEMA_VERSION


@attrs.frozen
class ReplicaRecord:
    """One replica the controller means to run (or to stop, if `stopping`)."""

    tag: str
    version: str
    config_digest: str
    """Digest of the user config the replica was started or last reconfigured with."""
    stopping: bool = False
    created_ms: int | None = None
    """When it was asked for, by the wall clock in milliseconds since the epoch (None in
    schema 1 data). Whole milliseconds: the stored text keeps one length."""
    served: bool = True
    """It had been ready. Schema 1 data does not say: taken as True, so that after an upgrade
    no replica that may be serving is taken for one that never did."""
    address: str | None = None
    """Where it serves, once it has: a restarted controller lists it to watchers at once, as
    the replica it adopts may be serving still (None before schema 3)."""
    revision: int | None = None
    """The revision it was started with, or last reconfigured to (None before schema 6)."""
    stopping_ms: int | None = None
    """When its stop began, by the wall clock in milliseconds (None: not stopping, or stored
    by a controller that did not say): a controller that takes over counts what is left of
    the drain's deadline from there, rather than granting a whole one again."""


@attrs.frozen
class FailureRecord:
    """The deploy of `generation` failed: what a restarted controller must not try again."""

    generation: int
    reason: Literal[
        "StartFailures",
        "ReconfigureFailed",
        "ProgressDeadlineExceeded",
        "UnhealthyAfterReady",
        "CanaryAborted",
    ]
    message: str
    """Why, as the goal and the status said it."""


@attrs.frozen
class AutoscaleRecord:
    """An autoscaled backend's autoscaler: its target and what its windows hold, with times by
    the wall clock in milliseconds since the epoch (the trio clock starts anew after a restart)."""

    target: int
    ups: list[tuple[int, int]] = attrs.field(factory=list)
    """(time, count) recommendations that may still be the upscale window's lowest."""
    downs: list[tuple[int, int]] = attrs.field(factory=list)
    """(time, count) recommendations that may still be the downscale window's highest."""
    changes: list[tuple[int, int]] = attrs.field(factory=list)
    """(time, signed change) made within the rate limits' periods."""
    busy_ms: int | None = None
    """When a request was last seen ongoing (scale to zero counts from it)."""


@attrs.frozen
class RolloutRecord:
    """How the rollout of a backend's revision went, as its loop last knew it."""

    revision: int
    outcome: RevisionOutcome
    good: bool = False
    error: str | None = None
    canary: CanaryRecord | None = None
    """Where its canary steps were, if it is rolled out as a canary."""


@attrs.frozen
class CanaryRecord:
    """A canary's progress: its step, and its clock by the wall clock (milliseconds since the
    epoch; the trio clock starts anew after a restart)."""

    step: int
    started_ms: int | None
    """When the step's clock started (None: its replicas were not all serving yet)."""
    held_s: float = 0.0
    """How long the step was held (paused) before `held_since_ms`."""
    held_since_ms: int | None = None
    """When the hold under way began (None: not held)."""
    promoted: bool = False
    aborted: bool = False


@attrs.frozen
class ReplicasRecord:
    """Every replica tag of one backend, and what the controller means to do with it."""

    name: str
    replicas: list[ReplicaRecord]
    failed: FailureRecord | None = None
    """The current generation's deploy failed (DEPLOY_FAILED), and how."""
    autoscale: AutoscaleRecord | None = None
    """Its autoscaler's state, for an autoscaled backend."""
    rollout: RolloutRecord | None = None
    """How the rollout of its spec's revision went (None before schema 6)."""
    pages: list[int] = attrs.field(factory=list)
    """The pages that hold the replicas after these, in order (``replicas/<name>/<page>``).
    Once read, `replicas` holds theirs too, and this says which keys they were read from."""
    schema: int = SCHEMA_VERSION


@attrs.frozen
class ReplicaPageRecord:
    """Some replicas of a backend too large for one record (``replicas/<name>/<page>``)."""

    name: str
    page: int
    replicas: list[ReplicaRecord]
    schema: int = SCHEMA_VERSION


@attrs.frozen
class RevisionsRecord:
    """A backend's revisions, oldest first."""

    name: str
    revisions: list[Revision]
    schema: int = SCHEMA_VERSION


@attrs.frozen
class EventRecord:
    """One event of a backend, as stored."""

    at_ms: int
    """By the wall clock, in milliseconds since the epoch."""
    kind: str
    message: str


@attrs.frozen
class EventsRecord:
    """A backend's recent events, oldest first."""

    name: str
    events: list[EventRecord]
    schema: int = SCHEMA_VERSION


def spec_key(name: str) -> str:
    return SPEC_PREFIX + name


def replicas_key(name: str) -> str:
    return REPLICAS_PREFIX + name


def page_key(name: str, page: int) -> str:
    return f"{REPLICAS_PREFIX}{name}/{page}"


def events_key(name: str) -> str:
    return EVENTS_PREFIX + name


def revisions_key(name: str) -> str:
    return REVISIONS_PREFIX + name
