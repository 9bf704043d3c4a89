"""What a backend's loop holds: the spec it works toward, and each replica as it tracks it."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Container
from typing import TYPE_CHECKING, final

import attrs
import trio

from .._model.config import BackendConfig, ReplicaConfig
from .._model.json_values import JSON, digest
from .._model.reconcile import Target, resolve_limits
from .._model.records import SpecRecord
from .._model.status import ReplicaState, ServingReplica
from .._ports.runtime import ReplicaSpec
from .pages import Page

if TYPE_CHECKING:
    from .replica_set import ReplicaSet

_tag_rng = random.SystemRandom()


@attrs.frozen
class Spec:
    """A backend's spec in memory: the stored record plus what is derived from it."""

    generation: int
    backend_config: BackendConfig
    replica_config: ReplicaConfig
    deleting: bool
    force: bool
    version: str
    """The code version replicas must have (``gen-N`` when the config names none)."""
    config_digest: str
    code_generation: int
    """The generation whose code a config without a version runs (see ``version``)."""
    rollback: tuple[str, JSON] | None = None
    """For an in-place change of user config: the digest and value of the config the replicas
    had before it, to go back to if the new one fails in a replica."""
    revision: int | None = None
    """The revision its replicas run (None only for a spec read from an older store, until
    recovery gives it one)."""
    paused: bool = False
    """Rollouts are paused: later deploys are recorded, not rolled out."""
    pending: int | None = None
    """While paused: the revision to roll out on resume."""

    @classmethod
    def from_record(cls, record: SpecRecord) -> Spec:
        config = record.backend_config
        rollback = None
        if record.rollback_config is not None:
            previous = json.loads(record.rollback_config)
            rollback = (digest(previous), previous)
        return cls(
            generation=record.generation,
            backend_config=config,
            replica_config=record.replica_config,
            deleting=record.deleting,
            force=record.force,
            version=(
                config.version
                if config.version is not None
                else f"gen-{record.code_generation or record.generation}"
            ),
            code_generation=record.code_generation or record.generation,
            config_digest=digest(config.user_config),
            rollback=rollback,
            revision=record.revision,
            paused=record.paused,
            pending=record.pending,
        )

    def config_to_hold(self, *, rolled_back: bool) -> tuple[str, JSON]:
        """The user config (digest, value) replicas should hold: the spec's, or, once it has
        failed in a replica (`rolled_back`), the one before it."""
        if rolled_back and self.rollback is not None:
            return self.rollback
        return self.config_digest, self.backend_config.user_config

    def target(
        self,
        config_digest: str,
        *,
        blocked: bool,
        deferred: bool,
        replicas: int | None = None,
        halted: bool = False,
    ) -> Target:
        """What the decision works toward for this spec; `replicas`: the autoscaler's count,
        which an autoscaled backend has instead of `num_replicas`."""
        config = self.backend_config
        count = config.num_replicas if replicas is None else replicas
        surge, unavailable = resolve_limits(count, config.max_surge, config.max_unavailable)
        return Target(
            num_replicas=count,
            version=self.version,
            config_digest=config_digest,
            max_surge=surge,
            max_unavailable=unavailable,
            deleting=self.deleting,
            starts_blocked=blocked,
            starts_deferred=deferred,
            halted=halted,
        )

    def replica_spec(self, name: str, replica: Replica, user_config: JSON) -> ReplicaSpec:
        """What the runtime needs to start `replica` of backend `name`."""
        return ReplicaSpec(
            tag=replica.tag,
            backend=name,
            version=replica.version,
            replica_config=self.replica_config,
            user_config=user_config,
            resources=self.backend_config.resources,
        )

    def to_record(self, name: str) -> SpecRecord:
        """The record this spec was read from (its rollback config as stored)."""
        rollback = None
        if self.rollback is not None:
            rollback = json.dumps(self.rollback[1], separators=(",", ":"), allow_nan=False)
        return SpecRecord(
            name,
            self.generation,
            self.backend_config,
            self.replica_config,
            deleting=self.deleting,
            force=self.force,
            rollback_config=rollback,
            code_generation=self.code_generation,
            revision=self.revision,
            paused=self.paused,
            pending=self.pending,
        )


def deploy_record(
    name: str,
    old: Spec | None,
    backend_config: BackendConfig,
    replica_config: ReplicaConfig,
    *,
    held: tuple[str, JSON] | None = None,
    code_generation: int | None = None,
    revision: int | None = None,
    paused: bool = False,
    pending: int | None = None,
) -> SpecRecord:
    """The record of a deploy of these configs over `old` (the spec last asked, if any).
    `held` is the config the replicas went back to when `old`'s own change of config failed.
    `code_generation`: the generation whose code an unversioned config runs, when it brings
    back a revision's (an undo); otherwise kept if the code is the same, else this one."""
    rollback = None
    version = backend_config.version
    digest_before, before = held or (
        (old.config_digest, old.backend_config.user_config) if old is not None else ("", None)
    )
    if (
        old is not None
        and not old.deleting
        and version is not None
        and version == old.backend_config.version
        and digest(backend_config.user_config) != digest_before
    ):
        # An in-place change of user config: keep the config the replicas hold, to go back to
        # (never one that failed already).
        rollback = json.dumps(before, separators=(",", ":"), allow_nan=False)
    generation = old.generation + 1 if old is not None else 1
    if (
        code_generation is None
        and old is not None
        and _same_code(old, backend_config, replica_config)
    ):
        code_generation = old.code_generation
    return SpecRecord(
        name,
        generation,
        backend_config,
        replica_config,
        rollback_config=rollback,
        code_generation=None if code_generation == generation else code_generation,
        revision=revision,
        paused=paused,
        pending=pending,
    )


def _same_code(old: Spec, backend_config: BackendConfig, replica_config: ReplicaConfig) -> bool:
    """Without a version, whether replicas of `old` run what these configs ask: the same class,
    arguments, user config and resources. Scale, rollout limits, timeouts, health checks and
    routing are the controller's business, not the replica's."""
    before = old.backend_config
    return (
        not old.deleting
        and backend_config.version is None
        and before.version is None
        and replica_config == old.replica_config
        and backend_config.resources == before.resources
        and digest(backend_config.user_config) == old.config_digest
    )


def delete_record(name: str, old: Spec, *, force: bool) -> SpecRecord:
    """The record of a delete of `old` (the spec last asked)."""
    return SpecRecord(
        name,
        old.generation + 1,
        old.backend_config,
        old.replica_config,
        deleting=True,
        force=force,
        code_generation=old.code_generation,
        revision=old.revision,
    )


@final
@attrs.define(eq=False)
class Replica:
    """One replica as the loop tracks it. Slotted and small: a controller may hold 10,000s.

    What its set counts of it (state, version, config digest, served) and whether it serves
    (its view, its state, its health) are told to the set as they change (the properties at
    the end), so the set keeps its census and the watch's serving replicas without walking
    them. Properties rather than attrs' ``on_setattr``: that hook runs on every field's every
    write, and a replica's fields are written a few dozen times in its life."""

    tag: str
    _version: str
    _config_digest: str
    _state: ReplicaState
    seq: int = attrs.field()
    """Start order within the backend: larger started later."""
    adopted: bool = False
    """Found alive at recovery rather than started by this controller."""
    _served: bool = False
    address: str | None = None
    pid: int | None = None
    node: str | None = None
    created_at: float | None = None
    """When it was asked for, by the wall clock (None if a schema-1 checkpoint did not say)."""
    graceful: bool = True
    """When stopping: drain before the kill (False for forced deletes and dead replicas)."""
    scope: trio.CancelScope | None = None
    """The scope of its in-flight start, adoption or reconfigure, so that a stop can cancel it."""
    drain_scope: trio.CancelScope | None = None
    resumed_stop: bool = False
    """Its stop was begun by an earlier controller (restored STOPPING, with its time)."""
    stopping_since: float | None = None
    """When its stop began, by the wall clock (stored, so that a controller that takes over
    grants the drain only what is left of its deadline)."""
    """Once stopping: cancelled to cut its drain short (a forced delete that comes meanwhile)."""
    _view: ServingReplica | None = None
    _healthy: bool = True
    check_failures: int = 0
    """Consecutive failed (or late) health checks."""
    next_check_at: float = math.inf
    """When its next health check is due (inf: none scheduled)."""
    checking: bool = False
    """A health check is in flight (never more than one)."""
    revision: int | None = None
    """The revision it was started with, or last reconfigured to."""
    ready_at: float = -math.inf
    """When it last became ready (trio time): a rollout's ``min_ready_s`` counts from it."""
    owner: ReplicaSet | None = attrs.field(default=None, repr=False)
    """The set it is in, told of its changes (None once removed)."""
    page: Page | None = attrs.field(default=None, repr=False)
    """The page of the set's checkpoint entries that holds its entry."""

    # Each write tells the set only what it keeps of that field: the census its count key
    # (state, version, config digest, served), the watch its entry (view, health, state). A
    # write of the same value tells nothing. (What the checkpoint holds of a replica changes
    # only through the set's own methods, which mark its entry stale.)

    @property
    def version(self) -> str:
        return self._version

    @version.setter
    def version(self, value: str) -> None:
        if self.owner is not None and value != self._version:
            self.owner.recount(self, (self._state, value, self._config_digest, self._served))
        self._version = value

    @property
    def config_digest(self) -> str:
        """Digest of the user config it holds (``UNKNOWN_CONFIG`` after a failed reconfigure)."""
        return self._config_digest

    @config_digest.setter
    def config_digest(self, value: str) -> None:
        if self.owner is not None and value != self._config_digest:
            self.owner.recount(self, (self._state, self._version, value, self._served))
        self._config_digest = value

    @property
    def state(self) -> ReplicaState:
        return self._state

    @state.setter
    def state(self, value: ReplicaState) -> None:
        if self.owner is not None and value is not self._state:
            self.owner.recount(self, (value, self._version, self._config_digest, self._served))
            self.owner.relist(self, self._view, self._healthy, value)
        self._state = value

    @property
    def served(self) -> bool:
        """It has been ready at some point (kept in the checkpoint, so that after a restart a
        replica being adopted that had served counts as serving)."""
        return self._served

    @served.setter
    def served(self, value: bool) -> None:
        if self.owner is not None and value != self._served:
            self.owner.recount(self, (self._state, self._version, self._config_digest, value))
        self._served = value

    @property
    def view(self) -> ServingReplica | None:
        """Its entry in watch snapshots, made once when it starts serving."""
        return self._view

    @view.setter
    def view(self, value: ServingReplica | None) -> None:
        if self.owner is not None:
            self.owner.relist(self, value, self._healthy, self._state)
        self._view = value

    @property
    def healthy(self) -> bool:
        """False while its latest health check failed (it is out of the watch snapshot then)."""
        return self._healthy

    @healthy.setter
    def healthy(self, value: bool) -> None:
        if self.owner is not None and value != self._healthy:
            self.owner.unhealthy += -1 if value else 1
            self.owner.relist(self, self._view, value, self._state)
        self._healthy = value


#: The config digest of a replica whose reconfigure failed: what it holds is not known.
UNKNOWN_CONFIG = "?"


def new_tag(name: str, taken: Container[str]) -> str:
    """A fresh replica tag for backend `name`, not in `taken`.

    Fresh OS randomness, never a seeded generator: a tag must stay unique across controller
    lifetimes, and a reopened controller with the same seed would replay.
    """
    while True:
        tag = f"{name}#{_tag_rng.getrandbits(48):012x}"
        if tag not in taken:
            return tag
