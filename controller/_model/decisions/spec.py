"""A backend's spec as the controller holds it, the records a change of it writes, and what a
runtime is asked to start for one replica: plain data, derived from the stored record."""

from __future__ import annotations

import json
from collections.abc import Mapping

import attrs

from ..config.config import BackendConfig, check_backend_name
from ..config.nodes import NodeRules
from ..config.replica_config import ReplicaConfig
from ..records.records import SpecRecord
from ..records.revisions import RevisionContent, replica_version, with_content
from ..values.errors import ConfigError
from ..values.json_values import JSON, digest
from .reconcile import Target, resolve_limits


@attrs.frozen
class ServingLimits:
    """What a replica's own server enforces, for code the worker serves (its backend's config
    at the replica's start)."""

    max_ongoing_requests: int = 100
    """Handlers that run at once; more requests wait in the replica."""
    request_timeout_s: float = 60.0
    """A request's deadline, unless its caller says less."""


@attrs.frozen
class ReplicaSpec:
    """Everything a runtime needs to start one replica."""

    tag: str
    """The replica's stable name; the runtime must be able to find the replica by it again later
    (after a controller restart), through ``list_replicas`` and ``adopt_replica``."""
    backend: str
    """The backend it belongs to."""
    version: str
    """Its code version."""
    replica_config: ReplicaConfig
    """Which class, with which arguments."""
    user_config: JSON
    """Handed to the replica's ``reconfigure`` before it counts as ready."""
    resources: Mapping[str, float]
    """What it reserves."""
    rules: NodeRules = attrs.field(factory=NodeRules)
    """Which nodes it may go to, and how a backend's replicas are spread over them."""
    serving: ServingLimits = attrs.field(factory=ServingLimits)
    """What its own server enforces (for code the worker serves)."""


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
    applied: str | None = None
    """The fields a manifest last applied (JSON text), for the next apply's merge."""
    restarted: int | None = None
    """The generation of the restart whose replicas these are (a config with a version)."""

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
            version=replica_version(
                config.version,
                record.code_generation or record.generation,
                record.restarted,
            ),
            code_generation=record.code_generation or record.generation,
            config_digest=digest(config.user_config),
            rollback=rollback,
            revision=record.revision,
            paused=record.paused,
            pending=record.pending,
            applied=record.applied,
            restarted=record.restarted,
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
        evict: frozenset[str] = frozenset(),
        evict_now: frozenset[str] = frozenset(),
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
            evict=evict,
            evict_now=evict_now,
            pack=config.placement == "pack",
        )

    def running(self, content: RevisionContent) -> Spec:
        """This spec's settings with `content`'s replicas (the stable revision of a canary)."""
        return attrs.evolve(
            self,
            backend_config=with_content(self.backend_config, content),
            replica_config=content.replica_config,
        )

    def replica_spec(self, name: str, tag: str, version: str, user_config: JSON) -> ReplicaSpec:
        """What the runtime needs to start replica `tag` (of `version`) of backend `name`."""
        return ReplicaSpec(
            tag=tag,
            backend=name,
            version=version,
            replica_config=self.replica_config,
            user_config=user_config,
            resources=self.backend_config.resources,
            rules=self.rules,
            serving=ServingLimits(
                self.backend_config.max_ongoing_requests, self.backend_config.request_timeout_s
            ),
        )

    @property
    def rules(self) -> NodeRules:
        """Where its replicas may go."""
        config = self.backend_config
        return NodeRules(
            config.placement == "pack", config.max_replicas_per_node, config.node_labels
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
            applied=self.applied,
            restarted=self.restarted,
        )


def deploy_record(
    name: str,
    old: Spec | None,
    backend_config: BackendConfig,
    replica_config: ReplicaConfig,
    *,
    held: tuple[str, JSON] | None = None,
    live_held: tuple[str, JSON] | None = None,
    code_generation: int | None = None,
    revision: int | None = None,
    paused: bool = False,
    pending: int | None = None,
    restarted: int | None = None,
) -> SpecRecord:
    """The record of a deploy of these configs over `old` (the spec last asked, if any).
    `held` is the config the replicas went back to when `old`'s own change of config failed;
    `live_held` the one live replicas of this version hold when `old` is of another version
    (one whose rollout failed before a replica of it ran): a change in place all the same.
    `code_generation`: the generation whose code an unversioned config runs, when it brings
    back a revision's (an undo); otherwise kept if the code is the same, else this one.
    `restarted`: the restart a versioned config's replicas come from, when it brings back a
    revision's or makes one; otherwise `old`'s, kept while the replicas' content is the same."""
    rollback = None
    version = backend_config.version
    if old is not None and not old.deleting and version is not None:
        kept = live_held
        if version == old.backend_config.version:
            kept = held or (old.config_digest, old.backend_config.user_config)
        if kept is not None and digest(backend_config.user_config) != kept[0]:
            # An in-place change of user config: keep the config the replicas hold, to go back
            # to (never one that failed already).
            rollback = json.dumps(kept[1], separators=(",", ":"), allow_nan=False)
    generation = old.generation + 1 if old is not None else 1
    if (
        code_generation is None
        and old is not None
        and _same_code(old, backend_config, replica_config)
    ):
        code_generation = old.code_generation
    if (
        restarted is None
        and old is not None
        and not old.deleting
        and same_replicas(old, backend_config, replica_config)
    ):
        restarted = old.restarted
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
        applied=old.applied if old is not None and not old.deleting else None,
        restarted=restarted,
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


def same_replicas(old: Spec, backend_config: BackendConfig, replica_config: ReplicaConfig) -> bool:
    """With a version, whether these configs ask for the replicas `old` has (a change of user
    config is made in place, so it keeps them too)."""
    before = old.backend_config
    return (
        backend_config.version is not None
        and backend_config.version == before.version
        and replica_config == old.replica_config
        and backend_config.resources == before.resources
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
        restarted=old.restarted,
    )


def check_declared(name: str, backend_config: object, replica_config: object) -> None:
    """A deploy's arguments, as a Python caller gives them: a plain name and configs."""
    check_backend_name(name)
    if not isinstance(backend_config, BackendConfig):
        raise ConfigError("backend_config", "must be a controller.BackendConfig", backend_config)
    if not isinstance(replica_config, ReplicaConfig):
        raise ConfigError("replica_config", "must be a controller.ReplicaConfig", replica_config)
    canary = backend_config.canary
    if canary is not None and canary.follows == name:
        raise ConfigError(
            "BackendConfig.canary.follows", "must name another backend, not this one", name
        )
