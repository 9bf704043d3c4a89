"""What a backend's loop holds: the spec it works toward, and each replica as it tracks it."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Container
from functools import partial
from typing import final

import attrs
import trio

from ._census import Census, Key, key_of
from ._checkpoint import (
    AutoscaleRecord,
    FailureRecord,
    ReplicaRecord,
    ReplicasRecord,
    RolloutRecord,
    SpecRecord,
    dump_replica,
    join_page,
    join_replicas,
    page_key,
    replicas_key,
)
from ._config import BackendConfig, ReplicaConfig
from ._json import JSON, digest
from ._pages import Page, Pages
from ._reconcile import Target, resolve_limits
from ._runtime import ReplicaInfo, ReplicaSpec
from ._state import ReplicaState, ServingReplica

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


def entry_of(r: Replica) -> str:
    """`r`'s entry in its backend's checkpoint (kept by the set's pages until it is stale)."""
    created_ms = None if r.created_at is None else round(r.created_at * 1000)
    return dump_replica(
        ReplicaRecord(
            r.tag,
            r.version,
            r.config_digest,
            r.state is ReplicaState.STOPPING,
            created_ms,
            r.served,
            r.address if r.served else None,
            r.revision,
            None if r.stopping_since is None else round(r.stopping_since * 1000),
        )
    )


@final
class ReplicaSet:
    """A backend's replicas by tag, and the part of them the store holds: every change of that
    part goes through here, and is noted with `changed` (so that the intent is written)."""

    def __init__(self, name: str, changed: Callable[[], None]):
        self.name = name
        self.by_tag: dict[str, Replica] = {}
        self.census = Census()
        self.serving: dict[str, ServingReplica] = {}
        """The replicas watchers are told of (listed, not stopping, healthy), by tag."""
        self.unhealthy = 0
        """How many of its replicas' latest health check failed."""
        # Each replica's checkpoint entry, in the order of `by_tag`, and the tags whose entry
        # must be made anew: a checkpoint re-encodes only what changed, and joins the rest.
        self._entries = Pages()
        self._stale: set[str] = set()
        self._changed = changed
        self._seq = 0
        self.failed: FailureRecord | None = None
        """The current generation's deploy failed: stored, so that a restart does not retry it."""
        self.autoscale: Callable[[], AutoscaleRecord | None] = lambda: None
        """The autoscaler's state, stored with the replicas (set by an autoscaled backend)."""
        self.rollout: Callable[[], RolloutRecord | None] = lambda: None
        """How the rollout of the spec's revision goes, stored with the replicas."""

    def add(
        self,
        tag: str,
        version: str,
        config_digest: str,
        state: ReplicaState = ReplicaState.STARTING,
        created_at: float | None = None,
        revision: int | None = None,
    ) -> Replica:
        self._seq += 1
        replica = Replica(tag, version, config_digest, state, self._seq, revision=revision)
        replica.created_at = time.time() if state is ReplicaState.STARTING else created_at
        if state is not ReplicaState.STOPPING:
            # Made now, not when its task starts, so that a stop decided before the task runs
            # can already cancel it.
            replica.scope = trio.CancelScope()
        self.by_tag[tag] = replica
        self.census.add(key_of(replica))
        replica.page = self._entries.add(tag)
        self._stale.add(tag)
        replica.owner = self
        self._changed()
        return replica

    def remove(self, tag: str) -> None:
        replica = self.by_tag.pop(tag)
        replica.owner = None
        self.census.remove(key_of(replica))
        self.unhealthy -= not replica.healthy
        self.serving.pop(tag, None)
        assert replica.page is not None
        self._entries.remove(replica.page, tag)
        replica.page = None
        self._stale.discard(tag)
        self._changed()

    # What a replica tells of its own writes, before it makes them:

    def recount(self, replica: Replica, key: Key) -> None:
        """`replica`'s count key becomes `key`."""
        self.census.move(key_of(replica), key)

    def relist(
        self, replica: Replica, view: ServingReplica | None, healthy: bool, state: ReplicaState
    ) -> None:
        """`replica` will have this `view`, health and `state`: listed to watchers or not."""
        if view is not None and healthy and state is not ReplicaState.STOPPING:
            self.serving[replica.tag] = view  # a replica listed already keeps its place
        else:
            self.serving.pop(replica.tag, None)

    def stale(self, replica: Replica) -> None:
        """`replica`'s checkpoint entry must be made anew."""
        self._stale.add(replica.tag)

    def set_config(self, replica: Replica, config_digest: str, revision: int | None = None) -> None:
        """`replica` holds `config_digest` now (and runs `revision`, if given)."""
        replica.config_digest = config_digest
        if revision is not None:
            replica.revision = revision
        self.stale(replica)
        self._changed()

    def begin_stop(self, replica: Replica, *, graceful: bool) -> bool:
        """Mark `replica` STOPPING (to be drained first if `graceful`); True if it was serving
        (so the watch snapshot changes)."""
        # In the snapshot: serving, or being adopted and listed as it may be serving still.
        serving = replica.view is not None and replica.state is not ReplicaState.STOPPING
        replica.state = ReplicaState.STOPPING
        replica.graceful = graceful
        replica.drain_scope = trio.CancelScope() if graceful else None
        if replica.stopping_since is None:
            replica.stopping_since = time.time()
        self.stale(replica)
        self._changed()
        return serving

    def running(self, replica: Replica, info: ReplicaInfo) -> bool:
        """Mark `replica` RUNNING where `info` says it serves; True if what the store holds of it
        changed (it had not served, or serves at a new address)."""
        replica.state = ReplicaState.RUNNING
        replica.healthy = True  # an adoption late to answer has answered
        stored = replica.served and replica.address == info.address
        replica.address, replica.pid, replica.node = info.address, info.pid, info.node
        replica.view = ServingReplica(replica.tag, replica.version, info.address)
        if stored:
            return False
        replica.served = True
        self.stale(replica)
        return True

    def restore(self, record: ReplicasRecord | None, live: set[str], graceful: bool) -> list[str]:
        """Rebuild the replicas of a checkpoint that are `live` (to adopt, or to go on stopping);
        return the tags of the others (never started, or gone while no controller ran)."""
        dropped: list[str] = []
        for rec in record.replicas if record is not None else ():
            if rec.tag not in live:
                dropped.append(rec.tag)
                continue
            state = ReplicaState.STOPPING if rec.stopping else ReplicaState.RECOVERING
            created = None if rec.created_ms is None else rec.created_ms / 1000
            replica = self.add(
                rec.tag, rec.version, rec.config_digest, state, created, rec.revision
            )
            replica.adopted = True
            replica.served = rec.served
            if rec.served and rec.address is not None:
                # It may be serving still: listed to watchers until its adoption says otherwise.
                replica.address = rec.address
                replica.view = ServingReplica(rec.tag, rec.version, rec.address)
            replica.graceful = graceful
            if rec.stopping and rec.stopping_ms is not None:
                replica.stopping_since = rec.stopping_ms / 1000
                replica.resumed_stop = True
            if rec.stopping and graceful:
                replica.drain_scope = trio.CancelScope()
        if record is not None and record.pages:
            self._entries.held_by_store(record.pages)
        return dropped

    def cut_drains(self) -> None:
        """Cut short the drains under way: their kills follow at once (a forced delete)."""
        for replica in self.by_tag.values():
            if replica.state is ReplicaState.STOPPING and replica.graceful:
                replica.graceful = False
                if replica.drain_scope is not None:
                    replica.drain_scope.cancel()

    def set_failed(self, failed: FailureRecord | None) -> None:
        if failed != self.failed:
            self.failed = failed
            self._changed()

    def record(self) -> tuple[dict[str, str | None], Callable[[], None]]:
        """The checkpoint of the replicas, as the keys to write (the record, the pages that
        changed, None for pages no longer used), and what to call once they are stored. Only
        the entries that changed are made anew."""
        self._refresh()
        batch = self._entries.batch()
        changes: dict[str, str | None] = {
            replicas_key(self.name): join_replicas(
                self.name, batch.first, self.failed, self.autoscale(), self.rollout(), batch.listed
            )
        }
        for number, text in batch.written.items():
            changes[page_key(self.name, number)] = join_page(self.name, number, text)
        for number in batch.deleted:
            changes[page_key(self.name, number)] = None
        return changes, partial(self._entries.stored, batch)

    def _refresh(self) -> None:
        """Make anew the entries of the replicas whose stored part changed."""
        for tag in self._stale:
            replica = self.by_tag[tag]
            assert replica.page is not None
            self._entries.set(replica.page, tag, entry_of(replica))
        self._stale.clear()

    def record_text(self) -> str:
        """The whole checkpoint as one record, its pages' replicas in it (as recovery reads it
        back; for tests)."""
        self._refresh()
        return join_replicas(
            self.name,
            self._entries.joined(),
            self.failed,
            self.autoscale(),
            self.rollout(),
        )

    def page_keys(self) -> list[str]:
        """The keys of every page the store may hold (for a deletion)."""
        return [page_key(self.name, n) for n in self._entries.numbers()]
