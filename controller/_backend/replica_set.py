"""A backend's replicas by tag: what it counts of them, lists to watchers and stores of them.

Every change of what the store holds of a replica goes through the set, which marks its
checkpoint entry stale and notes the change (so that the intent is written); what the census
and the watch keep, the replicas themselves tell it as their fields change (``Replica``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import final

from .._clock import wall_now
from .._model.decisions.census import Census, Key, key_of
from .._model.records.checkpoint import dump_replica, join_page, join_replicas
from .._model.records.records import (
    AutoscaleRecord,
    FailureRecord,
    ReplicaRecord,
    ReplicasRecord,
    RolloutRecord,
    page_key,
    replicas_key,
)
from .._model.records.replica_state import ReplicaState
from .._model.views.serving import ServingReplica, ServingReplicas
from .._ports.runtime import ReplicaInfo
from .pages import Pages
from .replica import Replica


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
        self.serving = ServingReplicas()
        """The replicas watchers are told of (listed, not stopping, healthy): immutable, each
        change a new one sharing the rest, so that a snapshot takes it as it is."""
        self.unhealthy = 0
        """How many of its replicas' latest health check failed."""
        self.serving_of: dict[str, int] = {}
        """How many replicas of each version are in `serving` (what READY counts)."""
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
        replica.created_at = wall_now() if state is ReplicaState.STARTING else created_at
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
        self._unlist(replica)
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
            at = replica.listed_at
            if at is None:
                replica.listed_at = len(self.serving)
                self.serving = self.serving.appended(view)
                self._count(view.version, 1)
            elif self.serving[at] is not view:
                self._count(self.serving[at].version, -1)
                self._count(view.version, 1)
                self.serving = self.serving.replaced(at, view)  # it keeps its place
        else:
            self._unlist(replica)

    def _unlist(self, replica: Replica) -> None:
        """`replica` serves no more: the last listed takes its place, so nothing else moves."""
        at = replica.listed_at
        if at is None:
            return
        replica.listed_at = None
        self._count(self.serving[at].version, -1)
        last = len(self.serving) - 1
        if at != last:
            moved = self.serving[last]
            self.serving = self.serving.replaced(at, moved)
            self.by_tag[moved.tag].listed_at = at
        self.serving = self.serving.without_last()

    def _count(self, version: str, change: int) -> None:
        n = self.serving_of.get(version, 0) + change
        if n:
            self.serving_of[version] = n
        else:
            del self.serving_of[version]

    def stale(self, replica: Replica) -> None:
        """`replica`'s checkpoint entry must be made anew."""
        self._stale.add(replica.tag)

    def mark(
        self,
        replica: Replica,
        *,
        healthy: bool | None = None,
        state: ReplicaState | None = None,
        ready_at: float | None = None,
    ) -> None:
        """What the backend's other parts learn of `replica` (its health, from its checks; a
        state its loop moves it to; when it became ready, for the rollout), written here as
        every other field of it."""
        if healthy is not None:
            replica.healthy = healthy
        if state is not None:
            replica.state = state
        if ready_at is not None:
            replica.ready_at = ready_at

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
        if replica.stopping_since is None:
            replica.stopping_since = wall_now()
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
        if record is not None and record.pages:
            self._entries.held_by_store(record.pages)
        return dropped

    def cut_drains(self) -> None:
        """No stop drains from now on (a forced delete); the launcher cuts those under way."""
        for replica in self.by_tag.values():
            if replica.state is ReplicaState.STOPPING:
                replica.graceful = False

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
