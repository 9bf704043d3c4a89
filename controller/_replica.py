"""What a backend's loop holds: the spec it works toward, and each replica as it tracks it."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Container, Iterable
from typing import final

import attrs
import trio

from ._checkpoint import ReplicaRecord, SpecRecord, dump_replica, join_replicas
from ._config import BackendConfig, ReplicaConfig
from ._json import JSON, digest
from ._state import SERVING_STATES, ReplicaState, ServingReplica

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
    rollback: tuple[str, JSON] | None = None
    """For an in-place change of user config: the digest and value of the config the replicas
    had before it, to go back to if the new one fails in a replica."""

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
            version=config.version if config.version is not None else f"gen-{record.generation}",
            config_digest=digest(config.user_config),
            rollback=rollback,
        )


@final
@attrs.define(eq=False)
class Replica:
    """One replica as the loop tracks it. Slotted and small: a controller may hold 10,000s."""

    tag: str
    version: str
    config_digest: str
    """Digest of the user config it holds (``UNKNOWN_CONFIG`` after a failed reconfigure)."""
    state: ReplicaState
    seq: int
    """Start order within the backend: larger started later."""
    adopted: bool = False
    """Found alive at recovery rather than started by this controller."""
    served: bool = False
    """It has been ready at some point (kept in the checkpoint, so that after a restart a
    replica being adopted that had served counts as serving)."""
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
    """Once stopping: cancelled to cut its drain short (a forced delete that comes meanwhile)."""
    view: ServingReplica | None = None
    """Its entry in watch snapshots, made once when it starts serving."""
    record_json: str | None = None
    """Its entry in the checkpoint, cached; reset whenever what is stored of it changes."""
    healthy: bool = True
    """False while its latest health check failed (it is out of the watch snapshot then)."""
    check_failures: int = 0
    """Consecutive failed (or late) health checks."""
    next_check_at: float = math.inf
    """When its next health check is due (inf: none scheduled)."""
    checking: bool = False
    """A health check is in flight (never more than one)."""


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


def record_text(name: str, replicas: Iterable[Replica]) -> str:
    """The checkpoint of backend `name`'s replicas, from each one's cached entry (made anew only
    for those whose stored part changed: a record of 1,000 replicas does not re-encode 999)."""
    entries = []
    for r in replicas:
        if r.record_json is None:
            created_ms = None if r.created_at is None else round(r.created_at * 1000)
            stopping = r.state is ReplicaState.STOPPING
            r.record_json = dump_replica(
                ReplicaRecord(r.tag, r.version, r.config_digest, stopping, created_ms, r.served)
            )
        entries.append(r.record_json)
    return join_replicas(name, entries)


@final
class ReplicaSet:
    """A backend's replicas by tag, and the part of them the store holds: every change of that
    part goes through here, and is noted with `changed` (so that the intent is written)."""

    def __init__(self, name: str, changed: Callable[[], None]):
        self.name = name
        self.by_tag: dict[str, Replica] = {}
        self._changed = changed
        self._seq = 0

    def add(
        self,
        tag: str,
        version: str,
        config_digest: str,
        state: ReplicaState = ReplicaState.STARTING,
        created_at: float | None = None,
    ) -> Replica:
        self._seq += 1
        replica = Replica(tag, version, config_digest, state, self._seq)
        replica.created_at = time.time() if state is ReplicaState.STARTING else created_at
        if state is not ReplicaState.STOPPING:
            # Made now, not when its task starts, so that a stop decided before the task runs
            # can already cancel it.
            replica.scope = trio.CancelScope()
        self.by_tag[tag] = replica
        self._changed()
        return replica

    def remove(self, tag: str) -> None:
        del self.by_tag[tag]
        self._changed()

    def set_config(self, replica: Replica, config_digest: str) -> None:
        replica.config_digest = config_digest
        replica.record_json = None
        self._changed()

    def begin_stop(self, replica: Replica, *, graceful: bool) -> bool:
        """Mark `replica` STOPPING (to be drained first if `graceful`); True if it was serving
        (so the watch snapshot changes)."""
        serving = replica.state in SERVING_STATES
        replica.state = ReplicaState.STOPPING
        replica.graceful = graceful
        replica.drain_scope = trio.CancelScope() if graceful else None
        replica.record_json = None
        self._changed()
        return serving

    def record_text(self) -> str:
        return record_text(self.name, self.by_tag.values())
