"""Each replica of a backend as its loop tracks it (the spec it works toward is
``_model.decisions.spec``)."""

from __future__ import annotations

import math
import random
from collections.abc import Container
from typing import Protocol, final

import attrs

from .._model.decisions.census import Key
from .._model.records.replica_state import ReplicaState
from .._model.views.serving import ServingReplica
from .pages import Page

_tag_rng = random.SystemRandom()


class Owner(Protocol):
    """The set a replica is in (``replica_set.ReplicaSet``), told of its writes before they are
    made: named here by what it is told, so that a replica need not know the set."""

    unhealthy: int

    def recount(self, replica: Replica, key: Key) -> None: ...

    def relist(
        self, replica: Replica, view: ServingReplica | None, healthy: bool, state: ReplicaState
    ) -> None: ...


@final
@attrs.define(eq=False)
class Checks:
    """One replica's health checks as the health part (``health``) keeps them: its state,
    written there and nowhere else (a replica's own fields are its set's to write)."""

    failures: int = 0
    """Consecutive failed (or late) health checks."""
    next_at: float = math.inf
    """When its next health check is due (inf: none scheduled)."""
    in_flight: bool = False
    """A health check is in flight (never more than one)."""
    late: bool = False
    """The check in flight was counted late (failed): if it passes after all, that undoes
    nothing, or a check always slower than the period would pass as often as it fails."""


@final
@attrs.define(eq=False)
class Replica:
    """One replica as the loop tracks it. Slotted and small: a controller may hold 10,000s.
    Its fields are written by its set (``replica_set``) alone; its checks' bookkeeping is the
    health part's (``Checks``).

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
    resumed_stop: bool = False
    """Its stop was begun by an earlier controller (restored STOPPING, with its time)."""
    stopping_since: float | None = None
    """When its stop began, by the wall clock (stored, so that a controller that takes over
    grants the drain only what is left of its deadline)."""
    _view: ServingReplica | None = None
    _healthy: bool = True
    checks: Checks = attrs.field(factory=lambda: Checks(), repr=False)
    """Its health checks' bookkeeping: the health part's own (``health``), its one writer."""
    revision: int | None = None
    """The revision it was started with, or last reconfigured to."""
    ready_at: float = -math.inf
    """When it last became ready (trio time): a rollout's ``min_ready_s`` counts from it."""
    owner: Owner | None = attrs.field(default=None, repr=False)
    """The set it is in, told of its changes (None once removed)."""
    page: Page | None = attrs.field(default=None, repr=False)
    """The page of the set's checkpoint entries that holds its entry."""
    listed_at: int | None = attrs.field(default=None, repr=False)
    """Its place in its set's serving list while it is listed there (kept here rather than in
    a dict by tag: a dict entry per replica costs more than this field)."""

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
